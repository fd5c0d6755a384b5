"""Turns benchmarks/results/*.json into a Markdown report and PNG plots.

    python benchmarks/report.py [--results benchmarks/results] [--out benchmarks/results]

Reads the newest result file of each kind (encoder_*, decoder_*, seq2seq_*, ops_*, and JSON
written by ``cpuformer bench --json``; --all reads every file) and writes:

* ``REPORT.md``: per file, the machine and date, then one table per model kind: throughput of
  each engine per workload and dtype, and cpuformer's speed-up over each peer;
* ``throughput.png``: tokens/s by model kind and dtype for each engine (log scale), one panel per
  model kind (encoder tokens are input tokens, decoder and seq2seq tokens are generated ones);
* ``decode_latency.png``: decode milliseconds per token against context length for each engine,
  from the ``decode_vs_length`` section of bench_decoder.py results (skipped when absent).

Needs matplotlib for the plots (``--no-plots`` writes only the Markdown).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

ENGINE_NAMES = {"cpuformer": "cpuformer", "pytorch": "PyTorch", "torch": "PyTorch", "ctranslate2": "CTranslate2",
                "sentence_transformers": "sentence-transformers", "onnxruntime": "ONNX Runtime",
                "llamacpp": "llama.cpp"}
# llama.cpp's GGUF kinds count as the cpuformer dtype they are compared with (Q8_0 with int8, Q4_0 with int4)
DTYPE_SUFFIXES = {"fp32": "float32", "float32": "float32", "int8": "int8", "fp16": "float16", "float16": "float16",
                  "bf16": "bfloat16", "bfloat16": "bfloat16", "int8_float32": "int8", "int4": "int4",
                  "f32": "float32", "f16": "float16", "q8_0": "int8", "q4_0": "int4"}
KINDS = ("encoder", "decoder", "seq2seq")
COLORS = {"cpuformer": "#d62728", "PyTorch": "#1f77b4", "CTranslate2": "#2ca02c", "sentence-transformers": "#ff7f0e",
          "ONNX Runtime": "#9467bd", "llama.cpp": "#8c564b"}


def engine_and_dtype(key: str, entry: Dict[str, Any]) -> Tuple[str, str]:
    """'ctranslate2_fp32' -> ('CTranslate2', 'float32'); a dtype in the entry wins."""
    base, dtype = key, "float32"
    for suffix, name in DTYPE_SUFFIXES.items():
        if key.endswith("_" + suffix):
            base, dtype = key[: -len(suffix) - 1], name
            break
    dtype = entry.get("dtype", dtype) if isinstance(entry, dict) else dtype
    return ENGINE_NAMES.get(base, base), dtype


def _row(kind, model, workload, engine_key, entry, source, tokens_per_sequence=None) -> Optional[Dict[str, Any]]:
    if not isinstance(entry, dict):
        return None
    engine, dtype = engine_and_dtype(engine_key, entry)
    tok = entry.get("tok_per_s")
    seq = entry.get("seq_per_s")
    if tok is None and seq is not None and tokens_per_sequence:
        tok = seq * tokens_per_sequence
    if tok is None and seq is None:
        return None
    return {"kind": kind, "model": model, "workload": workload, "engine": engine, "dtype": dtype,
            "tok_per_s": tok, "seq_per_s": seq, "source": source}


def rows_from_file(path: str, data: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """(throughput rows, decode-vs-length series or None) of one result file."""
    name = os.path.basename(path)
    rows: List[Dict[str, Any]] = []
    curves = None
    results = data.get("results", {})
    if "rows" in data:  # cpuformer bench --json
        for r in data["rows"]:
            if "tok_per_s" in r:
                rows.append({"kind": r["kind"], "model": r["model"], "workload": r["workload"],
                             "engine": ENGINE_NAMES.get(r["engine"], r["engine"]), "dtype": r.get("dtype", "float32"),
                             "tok_per_s": r["tok_per_s"], "seq_per_s": r.get("seq_per_s"), "source": name})
    elif name.startswith("encoder"):
        for workload, entries in results.items():
            match = re.search(r"_(\d+)x(\d+)$", workload)
            length = int(match.group(2)) if match else None
            model = workload[: match.start()] if match else workload
            for key, entry in entries.items():
                row = _row("encoder", model, workload, key, entry, name, length)
                if row:
                    rows.append(row)
    elif name.startswith(("decoder", "seq2seq")):
        kind = "decoder" if name.startswith("decoder") else "seq2seq"
        for model, workloads in results.items():
            if not isinstance(workloads, dict):
                continue
            for workload, entries in workloads.items():
                if workload == "decode_vs_length":
                    curves = {"model": model, **entries}
                    continue
                if not isinstance(entries, dict):
                    continue
                for key, entry in entries.items():
                    row = _row(kind, model, workload, key, entry, name)
                    if row:
                        rows.append(row)
    return rows, curves


def kernel_rows(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for item in data.get("linear", []):
        out.append({"op": f"linear M={item['M']} K={item['K']} N={item['N']}", **item.get("gflops", {})})
    return out


def newest_files(directory: str, every: bool) -> List[str]:
    files = sorted(glob.glob(os.path.join(directory, "*.json")))
    if every:
        return files
    newest: Dict[str, str] = {}
    for path in files:  # names sort by date within a prefix: the last one wins
        prefix = re.sub(r"_?\d{4}-\d{2}-\d{2}.*$", "", os.path.basename(path)) or os.path.basename(path)
        newest[prefix] = path
    return sorted(newest.values())


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def markdown(files: List[Tuple[str, Dict[str, Any]]], plots: List[str]) -> str:
    lines = ["# cpuformer benchmark report", "",
             "Generated by `benchmarks/report.py` from `benchmarks/results/*.json`. Higher is better; "
             "\"× peer\" is cpuformer's throughput divided by the peer's (above 1: cpuformer is faster). "
             "Encoder tokens are input tokens; decoder and seq2seq tokens are generated tokens.", ""]
    for plot in plots:
        lines += [f"![{plot}]({plot})", ""]
    for path, data in files:
        name = os.path.basename(path)
        machine = data.get("machine", {})
        cpu = machine.get("cpu") or machine.get("cpu_model", "?")
        cores = machine.get("cores") or machine.get("logical_cpus", "?")
        threads = machine.get("threads", machine.get("num_threads", "?"))
        lines += [f"## {name}", "",
                  f"{cpu}, {cores} cores, {threads} threads, isa {machine.get('isa', '?')}, "
                  f"{machine.get('date', 'date not recorded')}" + (" (quick run)" if data.get("quick") else "")
                  + ("" if "ct2_isa" not in machine
                     else ", CTranslate2 at its own isa choice" if machine["ct2_isa"] == "default"
                     else f", CTranslate2 isa forced to {machine['ct2_isa']}"), ""]
        if data.get("note"):
            lines += [f"Note: {data['note']}", ""]
        if name.startswith("ops"):
            rows = kernel_rows(data)
            engines = [e for e in ("cpuformer", "numpy", "torch") if any(e in r for r in rows)]
            lines += ["| op (GFLOP/s) | " + " | ".join(engines) + " |", "|---" * (len(engines) + 1) + "|"]
            for r in rows:
                lines.append(f"| {r['op']} | " + " | ".join(_fmt(r.get(e)) for e in engines) + " |")
            lines.append("")
            continue
        rows, curves = rows_from_file(path, data)
        if not rows and not curves:
            lines += ["(no throughput rows)", ""]
            continue
        engines = [e for e in ("cpuformer", "PyTorch", "CTranslate2", "sentence-transformers")
                   if any(r["engine"] == e for r in rows)]
        engines += sorted({r["engine"] for r in rows} - set(engines))
        peers = [e for e in engines if e != "cpuformer"]
        groups: Dict[Tuple[str, str, str, str], Dict[str, Dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r["kind"], r["model"], r["workload"], r["dtype"]), {})[r["engine"]] = r
        unit = "tokens/s" if all(r["tok_per_s"] is not None for r in rows) else "tokens/s (sequences/s)"
        lines += ["| model kind | workload | dtype | " + " | ".join(f"{e} {unit}" for e in engines)
                  + "".join(f" | × {p}" for p in peers) + " |",
                  "|---" * (3 + len(engines) + len(peers)) + "|"]
        for (kind, model, workload, dtype), by_engine in groups.items():
            cells = []
            for e in engines:
                r = by_engine.get(e)
                if r is None:
                    cells.append("-")
                elif r["tok_per_s"] is None:
                    cells.append(f"({_fmt(r['seq_per_s'])} seq/s)")
                else:
                    cells.append(_fmt(r["tok_per_s"]))
            ours = by_engine.get("cpuformer")
            ratios = []
            for p in peers:
                peer = by_engine.get(p)
                key = "tok_per_s" if ours and peer and ours["tok_per_s"] and peer["tok_per_s"] else "seq_per_s"
                a, b = (ours or {}).get(key), (peer or {}).get(key)
                ratios.append(f"{a / b:.2f}×" if a and b else "-")
            label = workload if workload.startswith(model) else f"{model} {workload}"
            lines.append(f"| {kind} | {label} | {dtype} | " + " | ".join(cells)
                         + "".join(f" | {x}" for x in ratios) + " |")
        lines.append("")
        if curves:
            lengths = curves["lengths"]
            lines += [f"Decode time per token (ms) against context length, {curves['model']}, batch 1 "
                      f"({curves.get('new_tokens', '?')} tokens after each prompt, prefill excluded):", "",
                      "| engine | " + " | ".join(str(n) for n in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
            for key, values in curves["ms_per_token"].items():
                engine, _ = engine_and_dtype(key, {})
                lines.append(f"| {engine} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def plot_throughput(rows: List[Dict[str, Any]], path: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["tok_per_s"]]
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    if not kinds:
        return False
    engines = [e for e in ("cpuformer", "PyTorch", "CTranslate2", "sentence-transformers")
               if any(r["engine"] == e for r in rows)]
    engines += sorted({r["engine"] for r in rows} - set(engines))
    spare = iter(["#9467bd", "#8c564b", "#7f7f7f", "#bcbd22"])
    colors = {e: COLORS.get(e) or next(spare, "#17becf") for e in engines}
    def label_of(r):
        return r["workload"] if r["workload"].startswith(r["model"]) else f"{r['model']} {r['workload']}"

    all_groups: Dict[str, List[Tuple[str, str]]] = {}
    for kind in kinds:
        groups = all_groups.setdefault(kind, [])
        for r in rows:
            if r["kind"] == kind and (label_of(r), r["dtype"]) not in groups:
                groups.append((label_of(r), r["dtype"]))
    # Panel widths follow their number of bar groups, so every label gets the same room.
    sizes = [max(len(all_groups[k]), 3) for k in kinds]
    fig, axes = plt.subplots(1, len(kinds), figsize=(max(6.0, 0.55 * sum(sizes) + 1.5 * len(kinds)), 5.2),
                             squeeze=False, gridspec_kw={"width_ratios": sizes})
    for ax, kind in zip(axes[0], kinds):
        groups = all_groups[kind]
        width = 0.8 / len(engines)
        for i, engine in enumerate(engines):
            xs, ys = [], []
            for g, (label, dtype) in enumerate(groups):
                for r in rows:
                    if r["kind"] == kind and r["engine"] == engine and label_of(r) == label and r["dtype"] == dtype:
                        xs.append(g + (i - (len(engines) - 1) / 2) * width)
                        ys.append(r["tok_per_s"])
            if xs:
                bars = ax.bar(xs, ys, width, label=engine, color=colors[engine])
                ax.bar_label(bars, labels=[_fmt(y) for y in ys], fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{label.replace('_', ' ')} · {dtype}" for label, dtype in groups], fontsize=7,
                           rotation=55, ha="right", rotation_mode="anchor")
        ax.set_yscale("log")
        values = [r["tok_per_s"] for r in rows if r["kind"] == kind]
        ax.set_ylim(10 ** math.floor(math.log10(min(values))), 10 ** (math.log10(max(values)) + 0.35))
        ax.set_title(f"{kind}: tokens/s (higher is better)")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_decode_latency(curves: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, values in curves["ms_per_token"].items():
        engine, _ = engine_and_dtype(key, {})
        ax.plot(curves["lengths"], values, marker="o", label=engine, color=COLORS.get(engine))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode time per token (ms)")
    ax.set_title(f"{curves['model']}: decode time per token, batch 1 (lower is better)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=RESULTS, help="directory of result JSON files")
    parser.add_argument("--out", default=None, help="where REPORT.md and the PNGs go (default: --results)")
    parser.add_argument("--all", action="store_true", help="every result file, not only the newest of each kind")
    parser.add_argument("--no-plots", action="store_true", help="write only REPORT.md")
    args = parser.parse_args(argv)
    out = args.out or args.results
    files = []
    for path in newest_files(args.results, args.all):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as error:
            print(f"report: skipping {path}: {error}", file=sys.stderr)
            continue
        if isinstance(data, dict):
            files.append((path, data))
    if not files:
        print(f"report: no result files in {args.results}", file=sys.stderr)
        return 1
    all_rows: List[Dict[str, Any]] = []
    curves = None
    for path, data in files:
        rows, c = rows_from_file(path, data)
        all_rows += rows
        curves = c or curves
    os.makedirs(out, exist_ok=True)
    plots = []
    if not args.no_plots:
        if plot_throughput(all_rows, os.path.join(out, "throughput.png")):
            plots.append("throughput.png")
        if curves:
            plot_decode_latency(curves, os.path.join(out, "decode_latency.png"))
            plots.append("decode_latency.png")
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write(markdown(files, plots))
    print(f"wrote {os.path.join(out, 'REPORT.md')}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
