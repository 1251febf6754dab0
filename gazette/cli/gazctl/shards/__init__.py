"""``gazctl shards``: one module per command (Gazette's ``shards_*.go``), and ``COMMANDS``,
the table gazctl's parser is built from (as ``gazctl journals``).

Shard commands talk to any consumer process of the group (``--consumer.address``,
``$CONSUMER_ADDRESS`` or ``Address`` under ``[shards.Consumer]`` of gazctl.ini); ``--lag``
also reads journals' heads from the brokers (``[shards.Broker]``).
"""

from __future__ import annotations

from gazette.cli.gazctl.common import Command, apply_flags
from gazette.cli.gazctl.shards.apply import cmd_apply
from gazette.cli.gazctl.shards.edit import cmd_edit, edit_flags
from gazette.cli.gazctl.shards.list import add_list_flags, cmd_list
from gazette.cli.gazctl.shards.unassign import cmd_unassign, unassign_flags

COMMANDS: dict[str, Command] = {
    "apply": ("Apply shard specifications", """\
Apply a collection of ShardSpec creations, updates, or deletions, given as a YAML shard
space: a "common" ShardSpec whose fields every shard inherits unless it sets them, and a
list of "shards" (the format of "shards list -o yaml"). Each shard's "revision" must match
its current etcd revision (0 or absent creates, -1 skips the check), else nothing is
applied. Set "delete: true" on a shard to delete it. Source journals must exist and have a
framed content-type (e.g. application/x-ndjson), else nothing is applied.

Example:
  common:
    max_txn_duration: 1s
    sources: []
  shards:
  - id: counter-part-000
    sources:
    - journal: examples/counts/part-000
""", apply_flags, cmd_apply),
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
and proto. --lag shows, per source journal, how many bytes the shard has yet to read; use
it with a focused --selector, as it stats every listed shard.
""", add_list_flags, cmd_list),
    "unassign": ("Remove a shard assignment", """\
Remove the assignments of the shards matching --selector, causing them to be shortly
re-assigned by the allocator. This restarts failed shards (with --failed, only those), or
moves shards off an overloaded process.
""", unassign_flags, cmd_unassign),
}
