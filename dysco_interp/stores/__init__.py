"""Result stores: the JSONL files that runs append their records to and tables read back.

- `format`: the file format (a settings header, then one record a line), its errors, and reading
  a store without modifying it, plain or compressed;
- `store`: `ResultStore`, the resumable writer (one at a time, under a lock), `open_store`, and
  the shards of a data-parallel run;
- `archives`: store names and patterns that find a store's compressed archive too;
- `provenance`: where, when and by what command a record was made, kept beside its settings.

What jobs write into a store is theirs (`experiments`, `detection`); what a table reads from one
is the analysis library's (`analysis.records`). Nothing here imports either: they build on it.
"""
