"""``gazctl shards``: one module per command (Gazette's ``shards_*.go``), and ``COMMANDS``,
the table gazctl's parser is built from (as ``gazctl journals``).

Shard commands talk to any consumer process of the group (``--consumer.address``,
``$CONSUMER_ADDRESS`` or ``Address`` under ``[shards.Consumer]`` of gazctl.ini); ``--lag``
also reads journals' heads from the brokers (``[shards.Broker]``).
"""

from __future__ import annotations

from gazette.cli.gazctl.common import APPLY_TRANSACTIONS_HELP, Command, apply_flags
from gazette.cli.gazctl.shards.apply import cmd_apply
from gazette.cli.gazctl.shards.edit import cmd_edit, edit_flags
from gazette.cli.gazctl.shards.list import add_list_flags, cmd_list
from gazette.cli.gazctl.shards.prune import cmd_prune, prune_flags
from gazette.cli.gazctl.shards.recover import cmd_recover, recover_flags
from gazette.cli.gazctl.shards.unassign import cmd_unassign, unassign_flags

COMMANDS: dict[str, Command] = {
    "apply": ("Apply shard specifications", """\
Apply a collection of ShardSpec creations, updates, or deletions, given as a YAML shard
space: a "common" ShardSpec whose fields every shard inherits unless it sets them, and a
list of "shards" (the format of "shards list -o yaml"). Each shard's "revision" must match
its current etcd revision (0 or absent creates, -1 skips the check), else nothing of its
transaction is applied. Set "delete: true" on a shard to delete it. Source journals must
exist and have a framed content-type (e.g. application/x-ndjson), else nothing of the
transaction is applied.

Example:
  common:
    max_txn_duration: 1s
    sources: []
  shards:
  - id: counter-part-000
    sources:
    - journal: examples/counts/part-000

""" + APPLY_TRANSACTIONS_HELP, apply_flags, cmd_apply),
    "edit": ("Edit shard specifications", """\
Edit the shard specifications matching --selector in $EDITOR and apply the result.
Revisions are checked: if a shard changed since it was listed, nothing is applied.
""", edit_flags, cmd_edit),
    "list": ("List shards", """\
List shard specifications and status.

Use --selector to supply a LabelSelector which constrains the set of returned shards.
Shard selectors support an additional meta-label "id":
    --selector "id in (shard-12, shard-34)"

Formats: table (see the column flags), yaml (a shard space "shards apply" accepts), json
and proto. --lag shows, per source journal, how many bytes the shard has yet to read (a
column of the table; with -o json, each shard's "lag" object); use it with a focused
--selector, as it stats every listed shard.
""", add_list_flags, cmd_list),
    "prune": ("Removes fragments of a hinted recovery log which are no longer needed", """\
Recovery logs capture every write which has ever occurred in a shard's store, compactions
included, so they grow far beyond the data the store holds. Prune examines the hints (primary
and backups) of the shards matching --selector, finds the fragments of their recovery logs
which hold no byte of any live file, and deletes them from their fragment stores.

CAUTION: when recovery logs have been forked from other logs, include *all* shards which
participate in the forked history in one prune: hints of every referencing shard decide
whether a fragment is needed, and a shard left out may lose data it depends on. A log is
skipped (with a warning) while any selected shard lacks hints, and an unpersisted fragment
needed by no hints stops the prune: the selector misses a shard writing that log.

Use --file-root for logs in file:// fragment stores (the brokers' --broker.file-root).
""", prune_flags, cmd_prune),
    "recover": ("Recover the latest checkpoint from shard", """\
Recover the latest checkpoint of a shard by playing its recovery log.

Given a shard ID, fetches the shard's hints (primary, else the first backup) and plays its
recovery log from them to the log's write head, writing the store's files into --dir, which
must not exist or be empty. The player only reads: the shard's primary is not disturbed.
Progress (MB read, MB to go, files, ETA) is logged as playback goes.

Example:
  gazctl shards recover --id=your/shard/id --dir=path/to/dir
""", recover_flags, cmd_recover),
    "unassign": ("Remove a shard assignment", """\
Remove the assignments of the shards matching --selector, causing them to be shortly
re-assigned by the allocator. This restarts failed shards (with --failed, only those), or
moves shards off an overloaded process.
""", unassign_flags, cmd_unassign),
}
