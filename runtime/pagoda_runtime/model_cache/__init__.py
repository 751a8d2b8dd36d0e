"""Model delivery: fetch a model once into a cache folder that replicas then read.

`sources` parses the source URIs, `layout` is the on-disk contract between the download Job and
the replicas (a partial download is never visible under the final name), `hub` and `s3` fetch
with the maintained clients, `verify` checks sizes and hashes, `architecture` sizes the model from
its own files, `progress` is the one progress line format, and `fetch` runs it all.
Torch-free except `architecture`, which reads GGUF metadata through the runtime's reader.
"""
