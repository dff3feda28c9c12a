#!/usr/bin/env python3
"""uvbus against the raw ceilings measured in the same sitting: reads the JSON lines that
benchmark/compare.sh (several rounds) or scripts/bench.sh (one round) collected, prints a markdown
table of medians and ratios, and writes OUT/table.md and OUT/chart.dat (for benchmark/chart.sh).

    ratios.py OUT_DIR            (reads OUT_DIR/all.jsonl)

Rows: uvbus lines carry "part" and "case"; the project's raw ceilings (uvbus_raw_ceiling) "raw";
an independent baseline script's lines, when one ran, "baseline". Every line carries "round".
When both raw and baseline lines are there, a second table shows how well the two agree.
"""
import collections
import json
import statistics
import sys

# (label, uvbus key, ceiling key, hashed ceiling key or None, kind: t = throughput, l = latency)
CASES = [
    ("stream ipv4 8-128 B", "stream:ipv4/small", "raw:tcp-coalesced/small", "raw:tcp-coalesced-hash/small", "t"),
    ("stream ipv4 8-128 B --no-merge", "stream:ipv4/small/no-merge", "raw:tcp-coalesced/small", "raw:tcp-coalesced-hash/small", "t"),
    ("stream ipv6 8-128 B", "stream:ipv6/small", "raw:tcp-coalesced/small/ipv6", "raw:tcp-coalesced-hash/small/ipv6", "t"),
    ("stream unix 8-128 B", "stream:unix/small", "raw:unix-coalesced/small", "raw:unix-coalesced-hash/small", "t"),
    ("stream ipv4 8-16384 B", "stream:ipv4/large", "raw:tcp-coalesced/large", "raw:tcp-coalesced-hash/large", "t"),
    ("stream ipv6 8-16384 B", "stream:ipv6/large", "raw:tcp-coalesced/large/ipv6", "raw:tcp-coalesced-hash/large/ipv6", "t"),
    ("stream unix 8-16384 B", "stream:unix/large", "raw:unix-coalesced/large", "raw:unix-coalesced-hash/large", "t"),
    ("shm 8-128 B, 1 writer", "shm:small/1w", "raw:shm-ring/small", "raw:shm-ring-hash/small", "t"),
    ("shm 8-128 B, 2 writers", "shm:small/2w", "raw:shm-ring/small", "raw:shm-ring-hash/small", "t"),
    ("shm 8-128 B, one send() per message", "shm:small/1w-single", "raw:shm-ring/small", "raw:shm-ring-hash/small", "t"),
    ("shm 8-128 B, one send() per message, coalescing writer", "shm:small/1w-coalesce", "raw:shm-ring/small", "raw:shm-ring-hash/small", "t"),
    ("shm 8-16384 B, 1 writer", "shm:large/1w", "raw:shm-ring/large", "raw:shm-ring-hash/large", "t"),
    ("shm 8-16384 B, 2 writers", "shm:large/2w", "raw:shm-ring/large", "raw:shm-ring-hash/large", "t"),
    ("shm 8-16384 B, one send() per message", "shm:large/1w-single", "raw:shm-ring/large", "raw:shm-ring-hash/large", "t"),
    ("shm 8-16384 B, one send() per message, coalescing writer", "shm:large/1w-coalesce", "raw:shm-ring/large", "raw:shm-ring-hash/large", "t"),
    ("bus node tcp 8-128 B (vs bare channel)", "bus:tcp/node", "bus:tcp/raw-stream", None, "t"),
    ("bare tcp, frames as long as the node's (payload + 44 B)", "bus:tcp/raw-stream-node-size", "bus:tcp/raw-stream", None, "t"),
    ("bus node tcp 8-128 B (vs bare channel, node-long frames)", "bus:tcp/node", "bus:tcp/raw-stream-node-size", None, "t"),
    ("bus node tcp via parent", "bus:tcp/node-relay", "bus:tcp/raw-stream", None, "t"),
    ("bus node shm 8-128 B (vs bare channel)", "bus:shm/node", "bus:shm/raw-shm", None, "t"),
    ("bare shm, frames as long as the node's (payload + 44 B)", "bus:shm/raw-shm-node-size", "bus:shm/raw-shm", None, "t"),
    ("bus node shm 8-128 B (vs bare channel, node-long frames)", "bus:shm/node", "bus:shm/raw-shm-node-size", None, "t"),
    ("bus node shm via parent", "bus:shm/node-relay", "bus:shm/raw-shm", None, "t"),
    ("latency tcp 64 B", "stream:ipv4/pingpong64", "raw:tcp-pingpong", None, "l"),
    ("latency unix 64 B", "stream:unix/pingpong64", "raw:unix-pingpong", None, "l"),
    ("latency shm 64 B (busy-poll)", "shm:pingpong64/poll", "raw:shm-pingpong", None, "l"),
    ("latency shm 64 B (libuv loop)", "shm:pingpong64/uv", "raw:shm-pingpong", None, "l"),
    ("latency bus node tcp 64 B", "bus:tcp/node-pingpong64", "raw:tcp-pingpong", None, "l"),
    ("latency bus node shm 64 B", "bus:shm/node-pingpong64", "raw:shm-pingpong", None, "l"),
]


def key_of(j):
    for tag in ("raw", "baseline"):
        if tag in j:
            k = j[tag] + ("/" + j["dist"] if "dist" in j else "")
            if j.get("host") == "::1":
                k += "/ipv6"
            return tag + ":" + k
    return j.get("part", "?") + ":" + j.get("case", j.get("bench", "?"))


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


class Rounds:
    def __init__(self, rows):
        self.by_round = collections.defaultdict(dict)
        for j in rows:
            self.by_round[j.get("round", 1)][key_of(j)] = j

    def series(self, key, field):
        return [self.by_round[r][key].get(field) for r in sorted(self.by_round) if key in self.by_round[r]]

    def ratios(self, uk, bk, field):
        out = []
        for r in sorted(self.by_round):
            a = self.by_round[r].get(uk, {}).get(field)
            b = self.by_round[r].get(bk, {}).get(field)
            if a and b:
                out.append(a / b)
        return out


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "msg/s":
        return f"{v / 1e6:.2f} M msg/s"
    return f"{v:.1f} MB/s" if unit == "MB/s" else f"{v:.2f} µs p50"


def ratio_cell(rs):
    return ("**%.2f** (%s)" % (med(rs), " / ".join(f"{x:.2f}" for x in rs))) if rs else "-"


def main_table(R):
    md = ["| case | uvbus | ceiling | uvbus / ceiling (rounds) | hashed ceiling | uvbus / hashed | CPU ns/msg snd / rcv |",
          "|---|---:|---:|---|---:|---:|---:|"]
    chart = []
    for label, uk, bk, hk, kind in CASES:
        if kind == "t":
            f, unit = ("mb_per_s", "MB/s") if "16384" in label else ("msgs_per_s", "msg/s")
        else:
            f, unit = "p50_us", "µs"
        if not R.series(uk, f):
            continue
        hashed = ratio_cell(R.ratios(uk, hk, f)) if hk else "-"
        s, r = med(R.series(uk, "send_cpu_ns_per_msg")), med(R.series(uk, "cpu_ns_per_msg"))
        cpu = f"{s:.0f} / {r:.0f}" if kind == "t" and s is not None and r is not None else "-"
        md.append(f"| {label} | {fmt(med(R.series(uk, f)), unit)} | {fmt(med(R.series(bk, f)), unit)} | "
                  f"{ratio_cell(R.ratios(uk, bk, f))} | {fmt(med(R.series(hk, f)), unit) if hk else '-'} | "
                  f"{hashed} | {cpu} |")
        if kind == "t" and bk.startswith("raw:") and "no-merge" not in label and "send()" not in label:
            vals = [med(R.series(k, g)) or 0 for k in (uk, bk) for g in ("msgs_per_s", "mb_per_s")]
            chart.append(label.replace(" ", "_").replace(",", "") + " %.0f %.0f %.1f %.1f" % (vals[0], vals[2], vals[1], vals[3]))
    return md, chart


def agreement_table(R):
    keys = sorted({k[4:] for r in R.by_round.values() for k in r if k.startswith("raw:")})
    md = ["| raw ceiling | uvbus_raw_ceiling | independent baseline | ratio (rounds) |", "|---|---:|---:|---|"]
    for k in keys:
        f = "p50_us" if "pingpong" in k else ("mb_per_s" if "/large" in k else "msgs_per_s")
        unit = "µs" if f == "p50_us" else ("MB/s" if f == "mb_per_s" else "msg/s")
        rs = R.ratios("raw:" + k, "baseline:" + k, f)
        if rs:
            md.append(f"| {k} | {fmt(med(R.series('raw:' + k, f)), unit)} | "
                      f"{fmt(med(R.series('baseline:' + k, f)), unit)} | {ratio_cell(rs)} |")
    return md if len(md) > 2 else []


def main():
    out = sys.argv[1]
    rows = [json.loads(l) for l in open(out + "/all.jsonl") if l.strip().startswith("{")]
    R = Rounds(rows)
    md, chart = main_table(R)
    agree = agreement_table(R)
    if agree:
        md += ["", "The project's raw ceilings against the independent baseline, same sitting:", ""] + agree
    open(out + "/table.md", "w").write("\n".join(md) + "\n")
    open(out + "/chart.dat", "w").write("\n".join(chart) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
