#!/usr/bin/env python3
"""Decodes an OTLP ExportProfilesServiceRequest (protobuf bytes) with the PyPI package
opentelemetry-proto (pinned in .ci/run; 1.45.2 carries opentelemetry-proto v1.10.0, the
revision the Rust crate writes) and prints what the Rust test checks, as JSON:

  {"version": "<opentelemetry-proto version>",
   "resource": {key: value},
   "links": [{"trace_id": hex, "span_id": hex}],        # link_table without entry 0
   "functions": [name],                                  # function_table names
   "profiles": [{"sample_type": "type/unit", "period_type": "type/unit", "period": n,
                 "time_unix_nano": n, "duration_nano": n,
                 "per_link": {"<span_id hex>": sum of values},  # link_index 0 -> ""
                 "span_names": {"<span_id hex>": [span_name attribute values]},
                 "leaf_functions": [name]}]}

Usage: decode.py REQUEST_FILE. Exit 3 when the package is missing.
"""

import json
import sys

try:
    from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
    from opentelemetry.proto.version import __version__ as proto_version
except ImportError as e:  # the Rust test reports this as "skipped" (or fails in CI)
    print(f"opentelemetry-proto not importable: {e}", file=sys.stderr)
    sys.exit(3)


def main(path):
    request = profiles_service_pb2.ExportProfilesServiceRequest()
    with open(path, "rb") as f:
        request.ParseFromString(f.read())
    d = request.dictionary
    s = d.string_table

    def any_text(v):
        kind = v.WhichOneof("value")
        if kind == "string_value":
            return v.string_value
        if kind == "string_value_strindex":
            return s[v.string_value_strindex]
        if kind == "int_value":
            return str(v.int_value)
        return ""

    out = {
        "version": proto_version,
        "resource": {},
        "links": [
            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
            for l in list(d.link_table)[1:]
        ],
        "functions": [s[f.name_strindex] for f in d.function_table],
        "profiles": [],
    }
    for rp in request.resource_profiles:
        for kv in rp.resource.attributes:
            out["resource"][kv.key] = any_text(kv.value)
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                per_link = {}
                span_names = {}
                leaves = set()
                for sample in p.samples:
                    span = d.link_table[sample.link_index].span_id.hex() if sample.link_index else ""
                    per_link[span] = per_link.get(span, 0) + sum(sample.values)
                    for i in sample.attribute_indices:
                        a = d.attribute_table[i]
                        if s[a.key_strindex] == "span_name":
                            names = span_names.setdefault(span, [])
                            if any_text(a.value) not in names:
                                names.append(any_text(a.value))
                    stack = d.stack_table[sample.stack_index]
                    if stack.location_indices:
                        loc = d.location_table[stack.location_indices[0]]
                        for line in loc.lines:
                            leaves.add(s[d.function_table[line.function_index].name_strindex])
                out["profiles"].append(
                    {
                        "sample_type": f"{s[p.sample_type.type_strindex]}/{s[p.sample_type.unit_strindex]}",
                        "period_type": f"{s[p.period_type.type_strindex]}/{s[p.period_type.unit_strindex]}",
                        "period": p.period,
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "per_link": per_link,
                        "span_names": span_names,
                        "leaf_functions": sorted(leaves),
                    }
                )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
