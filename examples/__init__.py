"""The examples of the seed documents, each a package with its specs and its own README:
``stream_sum`` (the exactly-once soak)."""
