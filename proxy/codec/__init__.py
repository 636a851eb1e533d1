"""QueryResult <-> bytes: Prometheus JSON (decode, encode) and Arrow.

    json_scan.py    the compiled (numba) scanner of Prometheus JSON answers
    json_decode.py  decode_prometheus_json
    json_encode.py  encode_prometheus_json, iter_prometheus_json
    json_splice.py  a warm answer spliced from its cells' kept encoded samples
    deflate.py      gzip of answers (ISA-L), a spliced one from kept deflate fragments
    arrow.py        the cache's Arrow IPC payload, the public Arrow stream (only pyarrow importer)
    errors.py       CodecError, Undecodable, MalformedAnswer
    warmup.py       compile the hot path's kernels (`python -m proxy.codec.warmup`)
"""
