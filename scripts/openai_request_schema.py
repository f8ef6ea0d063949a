#!/usr/bin/env python3
"""Extracts the request bodies of OpenAI's published OpenAPI document
(openai/openai-openapi) into one self-contained JSON Schema (draft 2020-12): the
fixture tests/fixtures/openai/requests.schema.json, which the scripted OpenAI
server judges every request body by.

Usage:
  python3 scripts/openai_request_schema.py --git-dir CLONE/.git [--rev REV] \
      --oneof-to-anyof --strip-descriptions --out tests/fixtures/openai/requests.schema.json
  (or --yaml openapi.yaml --commit SHA)

Each entry (the body of POST /responses, /chat/completions, /batches) is closed
with `unevaluatedProperties: false`: the document leaves request objects open,
but the API refuses a field it does not define ("Unrecognized request argument
supplied"), and that is what the fixture is for.

Conversion OpenAPI -> JSON Schema 2020-12 (schema-aware walk; property *names*
such as "pattern" or "example" are never touched):
  * #/components/schemas/X            -> #/$defs/X
  * nullable: true                    -> "null" added to type (or anyOf-wrap when
                                         there is no type, e.g. $ref/allOf/oneOf);
                                         null also added to enum if present
  * nullable: false                   -> dropped
  * exclusiveMinimum/Maximum: bool    -> numeric form (3.0 style -> 2020-12)
  * $recursiveRef "#" (2019-09)       -> {"$ref": "#/$defs/<enclosing component>"}
  * $recursiveAnchor                  -> dropped
  * x-* extensions, discriminator, example (singular), non-array examples,
    xml, externalDocs                 -> dropped
  * deprecated / readOnly / writeOnly are kept: they are valid 2020-12
    meta-data annotations and do not affect validation.
"""
import argparse
import copy
import json
import re
import subprocess
import sys

import yaml

DEFAULT_GIT_DIR = None
REPO = "github.com/openai/openai-openapi"

OPERATIONS = [  # (path, method)
    ("/responses", "post"),
    ("/chat/completions", "post"),
    ("/batches", "post"),
]

COMP_PREFIX = "#/components/schemas/"

# Keywords whose value is a map name -> schema
MAP_KW = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
# Keywords whose value is a schema
ONE_KW = {"additionalProperties", "not", "if", "then", "else", "contains",
          "propertyNames", "unevaluatedProperties", "unevaluatedItems",
          "additionalItems", "contentSchema"}
# Keywords whose value is a list of schemas
LIST_KW = {"allOf", "anyOf", "oneOf", "prefixItems"}
# "items": schema or (2019-09-style) list of schemas
DROP_KW = {"discriminator", "example", "xml", "externalDocs", "$recursiveAnchor"}

# JSON Schema 2020-12 keywords (all vocabularies) -- used only to report
# unknown keywords that survive conversion.
KNOWN_KW = MAP_KW | ONE_KW | LIST_KW | {
    "items", "$ref", "$dynamicRef", "$dynamicAnchor", "$anchor", "$id", "$schema",
    "$comment", "$vocabulary", "type", "enum", "const", "multipleOf", "maximum",
    "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength",
    "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired", "format",
    "contentEncoding", "contentMediaType", "title", "description", "default",
    "deprecated", "readOnly", "writeOnly", "examples",
}


class Stats:
    def __init__(self):
        self.nullable_converted = 0
        self.nullable_enum = 0
        self.excl_bool = 0
        self.recursive_refs = 0
        self.dropped = {}
        self.unknown_kw = {}
        self.non_component_refs = []
        self.patterns = []  # (component, pattern)
        self.oneof = 0

    def drop(self, k):
        key = "x-*" if k.startswith("x-") else k
        self.dropped[key] = self.dropped.get(key, 0) + 1


def load_spec(args):
    if args.yaml:
        text = open(args.yaml, encoding="utf-8").read()
        commit = args.commit or "unknown"
    else:
        commit = subprocess.check_output(
            ["git", "--git-dir", args.git_dir, "rev-parse", args.rev], text=True).strip()
        text = subprocess.check_output(
            ["git", "--git-dir", args.git_dir, "show", f"{commit}:{args.spec}"], text=True)

    # Do not turn 2024-10-01 into datetime.date: keep YAML == the repo's openapi.json
    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass
    Loader.yaml_implicit_resolvers = {
        ch: [(tag, rx) for tag, rx in rs if tag != "tag:yaml.org,2002:timestamp"]
        for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return yaml.load(text, Loader=Loader), commit


def comp_name(ref):
    """'#/components/schemas/Foo' -> 'Foo'; JSON-pointer deeper refs -> first segment."""
    if not isinstance(ref, str) or not ref.startswith(COMP_PREFIX):
        return None
    return ref[len(COMP_PREFIX):].split("/")[0].replace("~1", "/").replace("~0", "~")


def collect_refs(node, out, stats, where):
    """All component names referenced anywhere inside node (generic walk: any
    '$ref' string under any key; component schemas never use $ref as a property
    name in a way that would matter here, and over-collecting is harmless)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                n = comp_name(v)
                if n is None:
                    stats.non_component_refs.append((where, v))
                else:
                    out.add(n)
            else:
                collect_refs(v, out, stats, where)
    elif isinstance(node, list):
        for v in node:
            collect_refs(v, out, stats, where)


ONEOF_TO_ANYOF = False


def convert(node, comp, stats, strip_desc):
    """Return a converted copy of schema `node` found inside component `comp`."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        return node
    out = {}
    nullable = False
    for k, v in node.items():
        if k.startswith("x-") or k in DROP_KW:
            stats.drop(k)
            continue
        if k == "examples" and not isinstance(v, list):
            stats.drop("examples(non-array)")
            continue
        if k == "nullable":
            nullable = bool(v)
            continue
        if strip_desc and k == "description":
            continue
        if k == "$ref":
            n = comp_name(v)
            out[k] = f"#/$defs/{v[len(COMP_PREFIX):]}" if n is not None else v
            continue
        if k == "$recursiveRef":
            if v != "#":
                raise SystemExit(f"unsupported $recursiveRef {v!r} in {comp}")
            stats.recursive_refs += 1
            out["$ref"] = f"#/$defs/{comp}"
            continue
        if k in MAP_KW and isinstance(v, dict):
            out[k] = {pn: convert(ps, comp, stats, strip_desc) for pn, ps in v.items()}
        elif k in ONE_KW:
            out[k] = convert(v, comp, stats, strip_desc)
        elif k in LIST_KW and isinstance(v, list):
            kk = k
            if k == "oneOf":
                stats.oneof += 1
                if ONEOF_TO_ANYOF:
                    kk = "anyOf" if "anyOf" not in node else k
            out[kk] = [convert(s, comp, stats, strip_desc) for s in v]
        elif k == "items":
            if isinstance(v, list):  # tuple form -> prefixItems
                out["prefixItems"] = [convert(s, comp, stats, strip_desc) for s in v]
            else:
                out[k] = convert(v, comp, stats, strip_desc)
        else:
            if k not in KNOWN_KW:
                stats.unknown_kw.setdefault(k, set()).add(comp)
            if k == "pattern" and isinstance(v, str):
                stats.patterns.append((comp, v))
            out[k] = copy.deepcopy(v)

    # OpenAPI 3.0 boolean exclusiveMinimum/Maximum -> 2020-12 numeric
    for ex, base in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(ex), bool):
            stats.excl_bool += 1
            if out[ex] and base in out:
                out[ex] = out.pop(base)
            else:
                del out[ex]

    if nullable:
        stats.nullable_converted += 1
        t = out.get("type")
        if "enum" in out and None not in out["enum"]:
            out["enum"] = list(out["enum"]) + [None]
            stats.nullable_enum += 1
        if isinstance(t, str):
            if t != "null":
                out["type"] = [t, "null"]
        elif isinstance(t, list):
            if "null" not in t:
                out["type"] = t + ["null"]
        else:
            # no type (e.g. $ref / allOf / oneOf): wrap so null is accepted.
            # Keep annotations outside, constraints inside.
            ann = {a: out.pop(a) for a in ("title", "description", "default",
                                           "deprecated", "readOnly", "writeOnly",
                                           "examples") if a in out}
            out = {**ann, "anyOf": [out, {"type": "null"}]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--git-dir", default=DEFAULT_GIT_DIR)
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--spec", default="openapi.yaml")
    ap.add_argument("--yaml", help="read spec from this file instead of git")
    ap.add_argument("--commit", help="commit id to record when --yaml is used")
    ap.add_argument("--out", required=True)
    ap.add_argument("--strip-descriptions", action="store_true")
    ap.add_argument("--oneof-to-anyof", action="store_true",
                    help="rewrite every oneOf as anyOf (OpenAPI tools pick the branch via the "
                         "dropped discriminator; strict oneOf refuses bodies that match "
                         "overlapping branches, e.g. Responses input messages)")
    args = ap.parse_args()
    global ONEOF_TO_ANYOF
    ONEOF_TO_ANYOF = args.oneof_to_anyof

    spec, commit = load_spec(args)
    oas_version = spec.get("openapi")
    info_version = spec.get("info", {}).get("version")
    comps = spec["components"]["schemas"]
    stats = Stats()

    entries = []
    for path, method in OPERATIONS:
        op = spec["paths"][path][method]
        rb = op.get("requestBody", {})
        if "$ref" in rb:  # #/components/requestBodies/...
            rb = spec["components"]["requestBodies"][rb["$ref"].split("/")[-1]]
        sch = rb["content"]["application/json"]["schema"]
        n = comp_name(sch.get("$ref"))
        if n is None:  # inline body schema: store it under a synthetic name
            n = op.get("operationId", path.strip("/").replace("/", "_")) + "Body"
            comps = dict(comps)
            comps[n] = sch
        entries.append((path, method, op.get("operationId"), n))

    # Batch API input-file line: the spec has no schema for it (checked below).
    batch_line = [k for k in comps if re.search(r"BatchRequestInput|BatchInput", k)]

    # transitive closure
    seen, todo, missing = set(), [e[3] for e in entries], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        if n not in comps:
            missing.add(n)
            continue
        seen.add(n)
        refs = set()
        collect_refs(comps[n], refs, stats, n)
        todo.extend(refs - seen)

    defs = {n: convert(comps[n], n, stats, args.strip_descriptions) for n in sorted(seen)}

    # closed vs open objects (per reachable object schema)
    def count_objects(node, acc, comp, path=""):
        if isinstance(node, dict):
            is_obj = node.get("type") == "object" or (
                isinstance(node.get("type"), list) and "object" in node["type"]) or "properties" in node
            if is_obj:
                ap_ = node.get("additionalProperties", "absent")
                kind = ("closed" if ap_ is False else
                        "open(absent)" if ap_ == "absent" else
                        "open(true)" if ap_ is True else "map(schema)")
                acc.setdefault(kind, []).append(f"{comp}{path}")
            for k, v in node.items():
                if k in ("enum", "const", "default", "examples"):
                    continue
                count_objects(v, acc, comp, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                count_objects(v, acc, comp, f"{path}/{i}")

    obj_kinds = {}
    for n, s in defs.items():
        count_objects(s, obj_kinds, n)
    top_level_ap = {n: (s.get("additionalProperties", "absent") if isinstance(s, dict) else s)
                    for n, s in defs.items()}

    entry_names = [e[3] for e in entries]
    for n in entry_names:
        defs[n] = {**defs[n], "unevaluatedProperties": False}
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (f"Generated by scripts/openai_request_schema.py from {REPO} file {args.spec} at commit "
                     f"{commit} (info.version {info_version}, OpenAPI {oas_version}; MIT licence, "
                     f"Copyright (c) OpenAI). "
                     + ("oneOf rewritten as anyOf. " if args.oneof_to_anyof else "")
                     + "Entry points: "
                     + ", ".join(f"#/$defs/{n} ({m.upper()} {p})" for p, m, _, n in entries)
                     + ". Each entry is closed (unevaluatedProperties: false), as the API refuses a field it "
                       "does not define. The root schema itself accepts anything; validate against an entry, "
                       "e.g. {\"$ref\": \"#/$defs/CreateResponse\", \"$defs\": <these $defs>}."),
        "$defs": defs,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False, sort_keys=False)
        f.write("\n")

    report = {
        "commit": commit, "openapi": oas_version, "info.version": info_version,
        "entries": entries, "batch_input_line_schemas": batch_line,
        "defs": len(defs), "missing_refs": sorted(missing),
        "non_component_refs": stats.non_component_refs,
        "nullable_converted": stats.nullable_converted,
        "nullable_with_enum": stats.nullable_enum,
        "exclusive_bool_converted": stats.excl_bool,
        "recursiveRef_converted": stats.recursive_refs,
        "oneOf_count": stats.oneof, "oneOf_to_anyOf": args.oneof_to_anyof,
        "dropped": stats.dropped,
        "unknown_keywords_kept": {k: sorted(v) for k, v in stats.unknown_kw.items()},
        "patterns": stats.patterns,
        "lookaround_patterns": [p for p in stats.patterns if re.search(r"\(\?<?[=!]", p[1])],
        "object_schemas_by_additionalProperties": {k: len(v) for k, v in obj_kinds.items()},
        "entry_top_level_additionalProperties": {n: top_level_ap[n] for n in entry_names},
    }
    json.dump(report, sys.stdout, indent=1, default=str)
    print()
    return obj_kinds


if __name__ == "__main__":
    main()
