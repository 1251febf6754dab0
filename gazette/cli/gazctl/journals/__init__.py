"""``gazctl journals``: one module per command (Gazette's ``journals_*.go``), and ``COMMANDS``,
the table gazctl's parser is built from: name -> (summary, description, flags, command).

Adding a command is a module plus a row here; a new group (``shards``) is a package of the same
shape plus one line in ``gazette.cli.gazctl``.
"""

from __future__ import annotations

from gazette.cli.gazctl.common import APPLY_TRANSACTIONS_HELP, Command, apply_flags, selector_only
from gazette.cli.gazctl.journals.append import append_flags, cmd_append
from gazette.cli.gazctl.journals.apply import cmd_apply
from gazette.cli.gazctl.journals.edit import cmd_edit, edit_flags
from gazette.cli.gazctl.journals.fragments import cmd_fragments, fragments_flags
from gazette.cli.gazctl.journals.list import add_list_flags, cmd_list
from gazette.cli.gazctl.journals.prune import cmd_prune, prune_flags
from gazette.cli.gazctl.journals.read import cmd_read, read_flags
from gazette.cli.gazctl.journals.reset_head import cmd_reset_head
from gazette.cli.gazctl.journals.suspend import cmd_suspend, suspend_flags

COMMANDS: dict[str, Command] = {
    "append": ("Append journal content", """\
Append content to one or more journals.

A label --selector is required, and determines the set of journals which are appended
(it is listed again every few seconds while appending, so journals may come and go).

If --framing 'none', then --mapping must be 'random' and the whole input is atomically
appended to a random journal of the selector (--selector name=my/journal picks one).

If --framing 'lines', records are read from the input line by line; each is mapped to a
journal and appended atomically, and records mapped to one journal keep their relative
order. --framing 'fixed' works alike with records delimited by a leading fixed-framing
header. Newlines and fixed-framing headers are kept in the appended records.

If --mapping 'random', each record goes to a random journal. If --mapping 'modulo' or
'rendezvous', each record is preceded by its partition key written with the same framing
(for 'lines': 'A-Partition-Key\\nA-Record\\n'); the key maps the record that follows
(FNV-1a modulo the journal count, or highest-random-weight hashing). Give binary keys
under 'lines' base64-encoded, with --base64. If --mapping 'direct', each record is
preceded by the name of its journal, which must be a current journal of the selector.

Use --log.level=debug to see each mapping decision.

Examples:
  gazctl journals append -l name=my/journal -i ./fizzbuzz
  gazctl attach-uuids rides.csv | awk -F, '{print $13}{print}' \\
    | gazctl journals append -l my-label --framing lines --mapping modulo
""", append_flags, cmd_append),
    "apply": ("Apply journal specifications", """\
Apply a collection of JournalSpec creations, updates, or deletions, given as a YAML
journal hierarchy (the format of "journals list -o yaml"). Each journal's "revision" must
match its current etcd revision (0 or absent creates, -1 skips the check), else nothing of
its transaction is applied. Set "delete: true" on a journal or a parent to delete.

""" + APPLY_TRANSACTIONS_HELP, apply_flags, cmd_apply),
    "edit": ("Edit journal specifications", """\
Edit the journal specifications matching --selector in $EDITOR and apply the result.
Revisions are checked: if a journal changed since it was listed, nothing is applied.
""", edit_flags, cmd_edit),
    "fragments": ("List journal fragments", """\
List fragments of selected journals, optionally restricted to those persisted within
[--from, --to) (unix seconds), with signed URLs when --url-ttl is given.
""", fragments_flags, cmd_fragments),
    "list": ("List journals", """\
List journal specifications and status. Use --selector to restrict the listing; journal
selectors also support the meta-labels "name" and "prefix":
    --selector "name in (foo/bar, baz/bing)"
    --selector "prefix = my/prefix/"
Formats: table (see the column flags), yaml (a hierarchy "journals apply" accepts),
json and proto.
""", add_list_flags, cmd_list),
    "prune": ("Deletes fragments older than the configured retention", """\
Delete fragments of matching journals from their stores once older than the journal's
fragment retention.
""", prune_flags, cmd_prune),
    "read": ("Read journal contents", """\
Read the contents of one or more journals.

A label --selector is required, and determines the set of journals which are read.
Matched journals are read concurrently and their content is multiplexed into the output
(or stdout) in whole-fragment spans: so long as appends hold whole messages, so does the
merged output (no record is cut by another journal's content).

The selector is listed again periodically: reads start for journals that come to match
it and stop for those that no longer do (a journal matching again resumes where it
stopped). Reads end at the write head, or go on waiting for new content with --block,
until Ctrl-C or SIGTERM. --tail starts reads of journals not in --offsets at the write
head. --offsets gives initial offsets (a JSON object of journal to offset), and
--offsets-out receives the final ones on exit.

Examples:
  gazctl journals read -l name=my/journal
  gazctl journals read -l my-label --block --tail
""", read_flags, cmd_read),
    "reset-head": ("Reset journal append offset (disaster recovery)", """\
Jump the append offset of journals forward to the largest offset of their fragment index,
so appends may proceed after brokers lost their replicated offset.
""", selector_only, cmd_reset_head),
    "suspend": ("Suspend idle journals", """\
Suspend idle journals to use fewer or zero broker replicas.
""", suspend_flags, cmd_suspend),
}
