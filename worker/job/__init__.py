"""One compaction job over its ports: the pipeline and its steps' values, the error tree
and its policy, the outcome event and its figures, retries, the lease heartbeat, and the
dry-run preview."""
