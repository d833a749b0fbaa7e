#!/usr/bin/env python3
"""Plot a `selfserve bench serve --json` report: TTFT and TPOT (p50, p99) and throughput against load.

    python3 tools/plot_bench.py report.json -o report.png [--label NAME other.json ...]

Several reports (e.g. selfserve and another server, same command) share the axes for comparison.
"""
import argparse
import json
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def series(report):
    levels = report["levels"]
    rate_mode = report.get("mode") == "rate"
    xs = [lv["rate"] if rate_mode else lv["concurrency"] for lv in levels]
    get = lambda key, p: [lv[key][p] * 1e3 for lv in levels]  # noqa: E731  (ms)
    return rate_mode, xs, {
        "ttft_p50": get("ttft_s", "p50"), "ttft_p99": get("ttft_s", "p99"),
        "tpot_p50": get("tpot_s", "p50"), "tpot_p99": get("tpot_s", "p99"),
        "tok_s": [lv["output_tok_per_s"] for lv in levels],
        "req_s": [lv["req_per_s"] for lv in levels],
        "errors": [lv["errors"] for lv in levels],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="JSON files written by selfserve bench serve --json")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--label", action="append", default=[], help="legend name per report (default: model)")
    args = ap.parse_args()

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    rate_mode = False
    for i, path in enumerate(args.reports):
        with open(path) as f:
            rep = json.load(f)
        rate_mode, xs, s = series(rep)
        name = args.label[i] if i < len(args.label) else rep.get("model", path)
        color = f"C{i}"
        axes[0].plot(xs, s["ttft_p50"], "o-", color=color, label=f"{name} p50")
        axes[0].plot(xs, s["ttft_p99"], "s--", color=color, label=f"{name} p99")
        axes[1].plot(xs, s["tpot_p50"], "o-", color=color, label=f"{name} p50")
        axes[1].plot(xs, s["tpot_p99"], "s--", color=color, label=f"{name} p99")
        axes[2].plot(xs, s["tok_s"], "o-", color=color, label=f"{name} output tok/s")
        for x, y, e in zip(xs, s["tok_s"], s["errors"]):
            if e:
                axes[2].annotate(f"{e} err", (x, y), textcoords="offset points", xytext=(0, 6), fontsize=8,
                                 color="red", ha="center")
    xlabel = "arrival rate (req/s)" if rate_mode else "concurrent clients"
    titles = ["time to first token (ms)", "time per output token (ms)", "output throughput (tok/s)"]
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        if not rate_mode:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    fig.suptitle("selfserve bench serve")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
