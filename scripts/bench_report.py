"""Writes BENCHMARKS.md from one run of `make bench` (the outputs in target/bench/).

    bench_report.py --plots OUT_DIR       the pictures' data, for examples/bench_plots.rs
    bench_report.py OUT_DIR BENCHMARKS.md  the file, with the pictures bench_plots drew

Each step of scripts/bench-steps.sh leaves its output in OUT_DIR; this script puts them under
their headings, with what each measures, and derives the summary table from them, so the file
always shows one run, dated, with its commit and its machine. A figure a step did not produce
reads "not measured in this run". How figures moved from run to run is the changelog's story.
"""

import json
import os
import re
import sys


def read(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()


def table_after(text, caption):
    """The rows (dicts by header) of the first markdown table after a line starting `caption`."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith(caption)), None)
    if start is None:
        return []
    rows, header = [], None
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if header:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def number(cell):
    """The first number of a cell ("309.9 (1.62)" -> 309.9, "$2.41" -> 2.41)."""
    m = re.search(r"-?[\d,]*\.?\d+", cell.replace(",", ""))
    return float(m.group(0)) if m else None


def span(values, fmt="{:.1f}"):
    values = [v for v in values if v is not None]
    if not values:
        return None
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


NOT_MEASURED = ("not measured in this run", "")


def figures(out):
    """The summary rows: (number, figure, target, (measured, verdict))."""
    batch = read(out, "batch.txt")
    cpu = table_after(batch, "Handler CPU per record")
    mem = [r for r in cpu if r.get("adapters") == "in memory"]
    sdk = [r for r in cpu if r.get("adapters") == "SDK + emulator"]
    col_f, col_r = "fresh CPU/record (µs)", "redelivered CPU/record (µs)"

    def within(rows, col, limit_us, unit="µs", scale=1.0):
        values = [number(r[col]) for r in rows]
        s = span([v / scale for v in values if v is not None], "{:.2f}" if scale > 1 else "{:.1f}")
        if s is None:
            return NOT_MEASURED
        worst = max(v for v in values if v is not None)
        if limit_us is None:
            return (f"{s} {unit}", "")
        if worst <= limit_us:
            return (f"{s} {unit}", "met")
        lo = min(v for v in values if v is not None) / limit_us
        return (f"{s} {unit}", f"**missed, {lo:.1f}–{worst / limit_us:.1f}×**")

    rows = [
        ("1a", "handler CPU per fresh record, in memory", "—", within(mem, col_f, None)),
        ("1b", "handler CPU per redelivered finished record, in memory", "—", within(mem, col_r, None)),
        ("1c", "handler CPU per fresh record, through the SDK", "≤ 0.3 ms", within(sdk, col_f, 300, "ms", 1000)),
        ("1d", "handler CPU per redelivered finished record, through the SDK", "≤ 0.1 ms",
         within(sdk, col_r, 100, "ms", 1000)),
    ]
    floor = table_after(batch, "Our CPU per DynamoDB request")
    ratios = []
    for r in floor:
        for col in ("fresh records", "redelivered records"):
            m = re.search(r"\(([\d.]+)\)", r.get(col, ""))
            if m:
                ratios.append(float(m.group(1)))
    if ratios:
        rows.append(("1e", "our CPU per DynamoDB request ÷ the SDK's floor, same run", "≤ 1.2×",
                     (f"{span(ratios, '{:.2f}')}×", "met" if max(ratios) <= 1.2 else "**missed**")))
    else:
        rows.append(("1e", "our CPU per DynamoDB request ÷ the SDK's floor, same run", "≤ 1.2×", NOT_MEASURED))
    # The ledger's latency, beside the CPU: the emulator's, so only as against the floor's request.
    waits = {r.get("job", ""): r for r in table_after(batch, "The ledger's latency a fresh job waits for")}
    short = waits.get("short answer", {})
    floor_ms = next((v for k, v in waits.items() if k.startswith("the floor")), {})
    job_ms = number(short.get("a job waits in all (medians)", ""))
    request_ms = re.match(r"([\d.]+)", floor_ms.get("accept (`UpdateItem`)", ""))
    if job_ms is not None and request_ms:
        rows.append(("1f", "the ledger's latency a fresh job waits for (claim, accept), medians, emulator", "—",
                     (f"{job_ms:.1f} ms (the floor's request {float(request_ms.group(1)):.1f} ms)", "")))
    else:
        rows.append(("1f", "the ledger's latency a fresh job waits for", "—", NOT_MEASURED))
    for n, col, target in (("2a", "DynamoDB calls/fresh record", 2), ("2b", "DynamoDB calls/redelivered record", 1)):
        values = [number(r.get(col, "")) for r in sdk]
        s = span(values, "{:.2f}")
        verdict = "met" if s and max(v for v in values if v is not None) <= target else "**missed**"
        rows.append((n, col.replace("/", " per "), str(target), (s, verdict) if s else NOT_MEASURED))
    dup = table_after(batch, "Duplicates within one batch")
    per_job = [number(r.get("DynamoDB calls per job", "")) for r in dup]
    if per_job and None not in per_job:
        extra = max(per_job) - min(per_job)
        rows.append(("2c", "extra DynamoDB calls per duplicate within one batch", "0",
                     (f"{extra:.2f}", "met" if extra == 0 else "**missed**")))
    else:
        rows.append(("2c", "extra DynamoDB calls per duplicate within one batch", "0", NOT_MEASURED))
    beat = [r for r in table_after(read(out, "heartbeat.txt"), "Heartbeat, per tick") if r.get("adapters") == "SDK + emulator"]
    if beat:
        ok = all(number(r["SQS calls"]) == -(-number(r["records in flight"]) // 10) for r in beat)
        rows.append(("2d", "SQS calls per heartbeat tick", "1 per 10 records",
                     ("1 per 10 records" if ok else "more", "met" if ok else "**missed**")))
    else:
        rows.append(("2d", "SQS calls per heartbeat tick", "1 per 10 records", NOT_MEASURED))
    wall = [number(r.get("ratio", "")) for r in table_after(batch, "Batch wall time against the ideal")]
    s = span(wall, "{:.3f}")
    rows.append(("3", "batch wall time ÷ ideal (50 ms calls, concurrency 16)", "≤ 1.2",
                 (s, "met" if s and max(wall) <= 1.2 else "**missed**") if s else NOT_MEASURED))
    cold = read(out, "cold.json")
    if cold:
        results = json.loads(cold)["results"]
        median = results[0]["median"] * 1000
        rows.append(("4", "cold start, process start to exit after one event", "< 50 ms",
                     (f"{median:.1f} ms median", "met" if median < 50 else "**missed**")))
        if len(results) > 1:
            traced = results[1]["median"] * 1000
            rows.append(("4b", "cold start with tracing on (spans to a local OTLP sink)", "—",
                         (f"{traced:.1f} ms median, {traced / median:.2f}× without", "")))
    else:
        rows.append(("4", "cold start, process start to exit after one event", "< 50 ms", NOT_MEASURED))
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", read(out, "peak.txt"))
    if m:
        mib = int(m.group(1)) / 1024
        rows.append(("5", "peak memory, one 10,000-record batch through the SDK", "< 64 MiB",
                     (f"{mib:.1f} MiB", "met" if mib < 64 else "**missed**")))
    else:
        rows.append(("5", "peak memory, one 10,000-record batch through the SDK", "< 64 MiB", NOT_MEASURED))
    for row, name, what in (("5b", "heavy", "ten Extended Client pointers to 8 MiB payloads"),
                            ("5c", "costly", "the worst valid batch (ten bodies just under the parse cost)")):
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", read(out, f"{name}.txt"))
        title = f"peak memory, {what}, the worker at 128 MB"
        if m:
            mib = int(m.group(1)) / 1024
            rows.append((row, title, "< 128 MiB", (f"{mib:.1f} MiB", "met" if mib < 128 else "**missed**")))
        else:
            rows.append((row, title, "< 128 MiB", NOT_MEASURED))
    m = re.search(r"arm64 deployable zip \(make build\): (\d+) bytes", read(out, "sizes.txt"))
    rows.append(("6", "deployable arm64 zip (`make build`)", "—",
                 (f"{int(m.group(1)) / 1e6:.2f} MB", "") if m else NOT_MEASURED))
    scale = read(out, "scale.txt")
    m = re.search(r"goodput ([\d.]+) % of the limit; 429s ([\d.]+) % of calls.*?throttling alone: (\d+)", scale)
    if m:
        g, t, f = float(m.group(1)), float(m.group(2)), int(m.group(3))
        met = g >= 90 and t <= 5 and f == 0
        rows.append(("7", "burst of 100,000 jobs, 1,000 invocations, rate-limited provider: goodput / 429s / "
                     "failed by throttling", "≥ 90 % / ≤ 5 % / 0", (f"{g:.1f} % / {t:.1f} % / {f}", "met" if met else "**missed**")))
    else:
        rows.append(("7", "burst of 100,000 jobs against a rate-limited provider", "≥ 90 % / ≤ 5 % / 0", NOT_MEASURED))
    cost = read(out, "cost.txt")
    bill = table_after(cost, "What a job costs on the AWS bill")
    if bill:
        ours = [number(r["per million jobs"]) for r in bill]
        peer = [number(r["Python peer"]) for r in bill if number(r.get("Python peer", ""))]
        verdict = ("met" if peer and max(ours) <= min(peer) else "**above the peer**") if peer else ""
        rows.append(("8", "AWS cost per million jobs, 0 s calls, by prompt size", "below the peer",
                     (f"${span(ours, '{:.2f}')} (peer ${span(peer, '{:.2f}')}, an earlier measurement)" if peer else f"${span(ours, '{:.2f}')}", verdict)))
        units = [number(r["write units per job (table + index)"]) for r in bill]
        rows.append(("9", "write units per fresh job, index writes included", "≤ 2 (the peer's)",
                     (span(units, "{:.2f}"), "met" if max(units) <= 2 else "**missed**")))
    else:
        rows.append(("8", "AWS cost per million jobs", "below the peer", NOT_MEASURED))
        rows.append(("9", "write units per fresh job", "≤ 2 (the peer's)", NOT_MEASURED))
    deferred = [r for r in table_after(cost, "Deferrable jobs through a provider batch") if "less" in r.get("vs. direct", "")]
    if deferred:
        saved = [number(r["vs. direct"]) for r in deferred]
        rows.append(("10", "a provider batch against a direct call, per million reference jobs, AWS included",
                     "≥ 45 % less", (f"{span(saved)} % less", "met" if min(saved) >= 45 else "**missed**")))
    else:
        rows.append(("10", "a provider batch against a direct call", "≥ 45 % less", NOT_MEASURED))
    mixed = {r.get("deployment"): r for r in table_after(read(out, "mixed.txt"), "A mixed backlog")}
    standard, chooser = mixed.get("everything standard"), mixed.get("the chooser")
    title = ("a mixed backlog due in 5 minutes to 2 days: the chooser's model cost ÷ everything "
             "standard, and deadlines met")
    # The calls' long tail makes a few jobs due in minutes miss on any path, and each run draws
    # its own: the chooser may miss at most 0.05 % of the jobs more than the standard run.
    target = "< 1×, misses ≤ standard's + 0.05 %"
    if standard and chooser:
        ratio = number(chooser["÷ everything standard"])
        jobs = number(chooser["met their deadline"].split(" of ")[1])
        met, met_standard = number(chooser["met their deadline"]), number(standard["met their deadline"])
        share = lambda r: r["met their deadline"].split("(")[-1].rstrip(")")
        rows.append(("10b", title, target,
                     (f"{ratio:.3f}×, {share(chooser)} met (standard {share(standard)})",
                      "met" if ratio < 1 and met_standard - met <= jobs * 0.0005 else "**missed**")))
    else:
        rows.append(("10b", title, target, NOT_MEASURED))
    # Item 2 of the webhooks' issue: an ended batch's answer is collected in seconds, even behind
    # the fault simulation's backlog (half its jobs wait hours for a first receive).
    pushed = re.search(r"a batch's end to its job's success \(webhooks\): median ([\d.]+) s", read(out, "chaos-webhooks.txt"))
    looked = re.search(r"a batch's end to its job's success \(looks alone\): median ([\d.]+) s", read(out, "chaos.txt"))
    title = "a batch's end to its job's `succeeded` behind a backlog, with webhooks: median"
    if pushed:
        seconds = float(pushed.group(1))
        against = f" (looks alone {float(looked.group(1)):.0f} s)" if looked else ""
        rows.append(("10c", title, "< 60 s", (f"{seconds:.1f} s{against}", "met" if seconds < 60 else "**missed**")))
    else:
        rows.append(("10c", title, "< 60 s", NOT_MEASURED))
    for n, name, run in (("11", "tenants.txt", "a tenant's trickle behind another's burst, fair queue and 50 % cap: p99 ÷ unloaded"),
                         ("12", "urgent.txt", "urgent jobs behind a backlog, urgent queue: p99 ÷ unloaded"),
                         ("13", "producers.txt", "a producer's trickle behind another's burst rotating 1,000 tenants and groups, each producer capped at 50 %: p99 ÷ unloaded")):
        ratios = re.findall(r"= ([\d.]+) x unloaded", read(out, name))
        if ratios:
            best = float(ratios[-1])
            rows.append((n, run, "≤ 2×", (f"{best:.2f}× (other runs: {', '.join(r + '×' for r in ratios[:-1])})",
                                           "met" if best <= 2 else "**missed**")))
        else:
            rows.append((n, run, "≤ 2×", NOT_MEASURED))
    return rows


# Each section: its heading, what it measures (no figures: those come from the run), the file
# of the step's output, and whether that output is plain text rather than markdown.
SECTIONS = [
    ("1. Handler CPU per record, calls per record, and the SDK's floor", "batch.txt", False,
     "`target/release/examples/bench_batch` on a current-thread runtime, with the worker's logs "
     "written as it writes them. The CPU window covers parsing the event JSON, as the runtime "
     "does, and handling it; the simulated call takes 0 ms. Fresh jobs are new job ids each "
     "round; redelivered ones are the same batch again after it succeeded. DynamoDB and S3 calls "
     "are counted by an SDK interceptor, retries included. **The floor** is a bare conditional "
     "`UpdateItem` through the handler's own DynamoDB client, with as many requests in flight as "
     "the handler runs records. **A fresh job's two requests, bare** are the claim's `PutItem` "
     "and the acceptance's `UpdateItem` with the same attributes and expressions, built from "
     "literals: the SDK's own cost of the bytes the design sends, without the ledger's code. "
     "The floor, those requests, the ledger's writes alone, fresh records and "
     "redelivered records alternate, so the machine's drift touches each alike. The SDK rows "
     "are missed by the SDK's own cost per request: a fresh record already makes the two "
     "requests the design needs (claim, accept), a redelivery one ([decision 74]"
     "(docs/decisions/0074-a-message-delivered-before-is-read-before-any-write-2026-12.md))."),
    ("2. Heartbeat: calls and CPU per tick", "heartbeat.txt", False,
     "`target/release/examples/bench_heartbeat`. Each tick extends the visibility of every "
     "record in flight and renews every lease; through the SDK the benchmark asserts that all of "
     "them were renewed on every tick. In memory the ticks follow each other within "
     "microseconds, so an extension that would not reach past what a record already has is "
     "skipped: fewer SQS calls than one per ten records. CPU is the heartbeat's own thread time."),
    ("3. What a job costs", "cost.txt", False,
     "`target/release/examples/bench_cost`. Jobs run through the worker's batch handler on the "
     "in-memory ledger metered by DynamoDB's documented rules (each write billed one unit per KB "
     "of the larger of the item before and after it, as the DynamoDB ledger stores it; each index "
     "one write to put or delete an entry and two to move one). S3 requests are counted by the "
     "store. List prices of `us-east-1`; the counts do not depend on the machine. The Python "
     "peer's column (Powertools' batch and idempotency utilities) is not measured by this run: "
     "`bench_cost` carries it from an earlier side-by-side measurement."),
    ("4. Cold start", "cold.txt", True,
     "`hyperfine -N --warmup 3 --runs 30 target/release/worker` with `AWS_LAMBDA_RUNTIME_API` "
     "pointing at `scripts/mock_runtime_api.py`, which hands each process one SQS event (one "
     "record of a finished job: one DynamoDB call to the emulator), takes the response and closes "
     "the connection so the process exits: configuration, SDK clients, the first event and its "
     "response. The same runs again with tracing on (`OTEL_EXPORTER_OTLP_ENDPOINT` at "
     "`scripts/otlp_sink.py`, a local OTLP sink standing in for a collector layer, its own cost "
     "not counted): the exporter built and the spans flushed by the end of the invocation; then "
     "the peak memory of one run of each."),
    ("5. Peak memory", "memory.txt", True,
     "`/usr/bin/time -v`: one batch of 10,000 fresh records through the SDK "
     "(`bench_batch peak 10000`); and the release worker at `AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128` "
     "taking one event of ten Extended Client pointers to 8 MiB payloads, and one of the worst "
     "valid batch: ten plain bodies of small maps, each just under the 32 MiB a document may "
     "cost parsed (`scripts/bench_payloads.py`)."),
    ("6. Sizes", "sizes.txt", True, "The release worker, and the arm64 zip when `make build` ran first."),
    ("7. Fault-injection simulation", "chaos.txt", True,
     "`cargo run --release --example chaos -- --seed 1 --jobs 10000`: 40 consumers, batches of 10, "
     "every fault kind on, in virtual time; the wall time is the simulation's own CPU. A "
     "violation is a broken property (VERIFICATION.md); the run fails on any."),
    ("7b. Fault-injection simulation with OpenAI's webhooks", "chaos-webhooks.txt", True,
     "`cargo run --release --example chaos -- --seed 2 --jobs 10000`: the same, on a seed that "
     "takes webhooks (every other pair of seeds), each batch's end announced 1 to 30 s after it "
     "through the real webhook function, some webhooks lost, repeated or forged. The last line "
     "before the violations compares with section 7's: the median time from a batch's end to "
     "its job's `succeeded`, with webhooks here and with looks ten minutes apart there."),
    ("7c. A mixed backlog through each way of picking a job's path", "mixed.txt", False,
     "`cargo run --release --example chaos -- --mixed --seed 1 --jobs 10000`: the simulation's "
     "world with its faults off but the paths' own refusals, one backlog run four times: every "
     "job at the standard price; `deferrable` marked by hand on the jobs due in 25 hours or more "
     "(the batch's window and an hour); the worker's chooser (`PATHS=batch,flex`), without and "
     "with OpenAI's webhooks. The model's cost is what the simulated provider ran, each call "
     "at its model's and path's price (a call cancelled at its job's deadline counted in full); "
     "a deadline is met when the job succeeded by it. The calls' long tail (one in thirty takes "
     "minutes) can make a job due in minutes miss on any path."),
    ("8. Scale: a burst against a rate-limited provider", "scale.txt", True,
     "`make scale`'s first run: the real handler, processor, heartbeat and ledger contract in "
     "virtual time against a modelled standard queue, 1,000 concurrent invocations of 10 records, "
     "and a provider that enforces 5,000 requests and 3,000,000 tokens a minute as two "
     "continuously refilled buckets. 100,000 jobs arrive at once; calls take 1–3 s; budgets are 3 "
     "attempts. Goodput is the share of the binding limit the model's executions used until the "
     "last job was first admitted. Deterministic per seed: the figures are exact, not medians."),
    ("9. Tenants and urgent jobs behind a burst", "tenants.txt", True,
     "The same world with a burst of 50,000 jobs and a trickle of 200 jobs, one every 3 s, whose "
     "latency from submit to acceptance is measured: a tenant's trickle behind another tenant's "
     "burst (one queue order; a fair queue; a fair queue with each tenant capped at 50 % of the "
     "pace), then urgent jobs behind a backlog (same queue; the urgent queue), then a "
     "producer's trickle behind another producer's burst of 10,000 whose tenants and message "
     "groups rotate through a thousand of each (each account capped at 50 %; each producer "
     "capped at 50 % too)."),
]

PLOTS = [
    ("benchmarks/scale.svg", "8. Scale", "The burst over time: calls the model ran and calls answered 429 per minute, and the jobs not yet ended."),
    ("benchmarks/drill.svg", "1.", "The recovery drill's timeline (`make drill`): receives, claims, renewals, the takeover and the acceptance."),
    ("benchmarks/floor.svg", "1.", "CPU per DynamoDB request: the SDK's floor, the ledger's writes alone, fresh and redelivered records."),
    ("benchmarks/cost.svg", "3.", "The reference job's whole bill (model and AWS) per million jobs, by model and path: a direct call, a batch line, and each service tier the price table prices for the model (no bar: its provider does not sell it)."),
]


def plots(out):
    """The pictures' data, as `bench_plots` reads it (`<name>.plot.json` in OUT_DIR)."""
    def write(name, plot):
        with open(os.path.join(out, name + ".plot.json"), "w", encoding="utf-8") as f:
            json.dump(plot, f)

    series = read(out, "scale-series.json")
    if series:
        minutes = json.loads(series)
        points = lambda key: [[i, m[key]] for i, m in enumerate(minutes)]
        write("scale", {
            "kind": "lines",
            "title": "A burst of 100,000 jobs against 5,000 requests a minute (make scale, seed 1)",
            "x_label": "minutes from the burst",
            "panels": [
                {"y_label": "calls per minute",
                 "series": [{"name": "run by the model", "points": points("executed")},
                            {"name": "answered 429", "points": points("throttled")}]},
                {"y_label": "jobs not yet ended", "series": [{"name": "backlog", "points": points("open")}]},
            ],
        })
    drill = read(out, "drill.json")
    if drill:
        rows = json.loads(drill)
        actors = list(dict.fromkeys(r["actor"] for r in rows))
        write("drill", {
            "kind": "timeline",
            "title": "The recovery drill (make drill): one job, a frozen owner, a takeover",
            "x_label": "seconds",
            "lanes": [f"worker {a}" if len(a) == 1 else a for a in actors],
            "events": [{"lane": actors.index(r["actor"]), "at": r["at"], "label": r["label"]} for r in rows],
        })
    paths = table_after(read(out, "cost.txt"), "The reference job by model and path")
    if paths:
        names = [("direct", "direct call, standard"), ("batch", "batch line"), ("flex", "flex tier"),
                 ("priority", "priority tier")]
        write("cost", {
            "kind": "bars",
            "title": "The reference job per million jobs, model and AWS, by path (bench_cost)",
            "y_label": "USD per million jobs",
            "groups": [r["model"].removeprefix("amazon.").removesuffix("-v1:0") for r in paths],
            "series": [{"name": label, "values": [number(r[col]) or 0.0 for r in paths]} for col, label in names],
        })
    floor = table_after(read(out, "batch.txt"), "Our CPU per DynamoDB request")
    if floor:
        cols = [("floor", "the SDK's floor"), ("a fresh job's two requests, bare", "a fresh job's requests, bare"),
                ("ledger writes alone", "the ledger's writes alone"),
                ("fresh records", "fresh records"), ("redelivered records", "redelivered records")]
        write("floor", {
            "kind": "bars",
            "title": "CPU per DynamoDB request against the SDK's floor (bench_batch)",
            "y_label": "µs of CPU per request",
            "groups": [f"{r['records per batch']} records per batch" for r in floor],
            "series": [{"name": label, "values": [number(r[col]) for r in floor]} for col, label in cols],
        })


def main(argv):
    if argv[0] == "--plots":
        plots(argv[1])
        return 0
    out, target = argv[0], argv[1]
    meta = json.loads(read(out, "meta.json") or "{}")
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by `make bench` (scripts/bench_report.py): edit the script, not this file. -->",
        "",
        f"One run of `make bench` on {meta.get('date', '?')}, commit `{meta.get('commit', '?')}`, on "
        f"{meta.get('machine', '?')} ({meta.get('rustc', '?')}). The machine is shared and noisy: "
        "compare figures within this run, not across machines. CPU figures are medians over "
        "rounds of work; the release build is `lto = \"thin\"`, `codegen-units = 1`; the local "
        "emulator (moto) is served behind a keep-alive server, as DynamoDB and SQS keep "
        "connections alive ([decision 14](docs/decisions/0014-the-benchmarks-talk-to-moto-through-a-keep-alive-server.md)). `make bench` is never part of `make test`. How figures "
        "moved from one version to the next is in the [changelog](CHANGELOG.md).",
        "",
        "| # | figure | target | measured | |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n, figure, target_, (measured, verdict) in figures(out):
        lines.append(f"| {n} | {figure} | {target_} | {measured} | {verdict} |")
    lines.append("")
    for path, _, caption in PLOTS:
        if os.path.exists(os.path.join(os.path.dirname(target) or ".", path)):
            lines += [f"![{caption}]({path})", "", f"*{caption}*", ""]
    for heading, name, plain, method in SECTIONS:
        lines += [f"## {heading}", "", method, ""]
        text = read(out, name).strip()
        if name == "tenants.txt":
            for more in ("urgent.txt", "producers.txt"):
                text = (text + "\n\n" + read(out, more).strip()).strip()
        if not text:
            lines += ["Not measured in this run.", ""]
        elif plain:
            lines += ["```text", text, "```", ""]
        else:
            lines += [text, ""]
    with open(target, "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
