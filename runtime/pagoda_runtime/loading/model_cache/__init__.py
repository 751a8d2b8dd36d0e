"""Model delivery, the download half: fetch a model once into a cache folder that replicas then read.

`hub` and `s3` fetch with the maintained clients, `verify` checks sizes and hashes, `architecture`
sizes the model from its own files, and `fetch` runs it all. What the operator shares with it (the
source URIs and cache key, the folder's layout, the progress line) is in `pagoda_runtime.contract`
(`sources`, `cache_layout`, `download_progress`).
"""
