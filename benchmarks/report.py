"""Turns benchmarks/results/*.json into a Markdown report and PNG plots.

    python benchmarks/report.py [--results benchmarks/results] [--out benchmarks/results]

Reads the newest result file of each kind (encoder_*, decoder_*, seq2seq_*, ops_*, vision_*, serve_* (one
per model and dtype), and JSON written by ``cpuformer bench --json``; --all reads every file) and writes:

* ``REPORT.md``: per file, the machine and date, then one table per model kind: throughput of
  each engine per workload and dtype, and cpuformer's speed-up over each peer;
* ``throughput.png``: tokens/s by model kind and dtype for each engine (log scale), one panel per
  model kind (encoder tokens are input tokens, decoder and seq2seq tokens are generated ones);
* ``decode_latency.png``: decode milliseconds per token against context length for each engine,
  from the ``decode_vs_length`` section of bench_decoder.py results (skipped when absent);
* ``vision.png``: images/s of each engine per bench_vision.py row and dtype, and the CLIP
  embedding with and without preprocessing (from the newest vision_* file; skipped when absent);
* ``serve.png``: aggregate generated tokens/s and p99 inter-token latency against the number of
  concurrent streaming clients, cpuformer serve and llama.cpp's server, one line per engine, model
  and dtype (from the serve_* files of bench_serve.py; skipped when absent). REPORT.md gets each
  serve file's table (per client count and engine), its prefix, embedding and issue 22 target rows.

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
        if name.startswith("vision"):
            lines += vision_markdown(data)
            continue
        if name.startswith("serve"):
            lines += serve_markdown(data)
            continue
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


VISION_ENGINES = ("cpuformer", "PyTorch", "ONNX Runtime")
PREPROCESS_LABELS = (("model_only", "pixel values (model only)"), ("end_to_end_arrays", "uint8 arrays, end to end"),
                     ("end_to_end_jpeg", "JPEG files, end to end"))


def vision_rows(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per (bench_vision.py result, dtype): {engine: images/s or "not supported"}, and
    cpuformer's fraction of the compute peak."""
    out: List[Dict[str, Any]] = []
    for name, entry in data.get("results", {}).items():
        if not isinstance(entry, dict) or "target_share" in entry or "skipped" in entry:
            continue
        by_dtype: Dict[str, Dict[str, Any]] = {}
        for key, cell in entry.items():
            if not isinstance(cell, dict) or key in ("ratios", "onnxruntime_build"):
                continue
            engine, dtype = engine_and_dtype(key, cell)
            row = by_dtype.setdefault(dtype, {"name": name, "model": entry.get("model", name),
                                              "batch": entry.get("batch"), "dtype": dtype, "rates": {}})
            if "img_per_s" in cell:
                row["rates"][engine] = cell["img_per_s"]
                if engine == "cpuformer" and "of_peak" in cell:
                    row["of_peak"] = cell["of_peak"]
            elif "not_supported" in cell:
                row["rates"][engine] = "not supported"
            elif "error" in cell:
                row["rates"][engine] = "failed"
        out += list(by_dtype.values())
    return out


def _preprocess_entries(data: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    return [(name, entry) for name, entry in data.get("results", {}).items()
            if isinstance(entry, dict) and "target_share" in entry]


def vision_markdown(data: Dict[str, Any]) -> List[str]:
    """The tables of a bench_vision.py result file: images/s per engine, ratios, cpuformer's share
    of the compute peak, and the preprocessing share."""
    lines: List[str] = []
    peaks = data.get("peak_gops") or {}
    if peaks:
        lines += ["Compute peak measured by `ops.peak_gops`: " + ", ".join(
            f"{dtype} {value:,.0f} GOP/s" for dtype, value in peaks.items()) + ".", ""]
    peers = [e for e in VISION_ENGINES if e != "cpuformer"]
    lines += ["| model | batch | dtype | " + " | ".join(f"{e} images/s" for e in VISION_ENGINES)
              + "".join(f" | × {p}" for p in peers) + " | cpuformer of peak |",
              "|---" * (4 + len(VISION_ENGINES) + len(peers)) + "|"]
    for row in vision_rows(data):
        rates = row["rates"]
        cells = [rates[e] if isinstance(rates.get(e), str) else _fmt(rates.get(e)) for e in VISION_ENGINES]
        ours = rates.get("cpuformer")
        ratios = []
        for p in peers:
            peer = rates.get(p)
            ratios.append(f"{ours / peer:.2f}×" if isinstance(ours, float) and isinstance(peer, float) else "-")
        peak = f"{100 * row['of_peak']:.0f} %" if "of_peak" in row else "-"
        lines.append(f"| {row['model']} | {row['batch']} | {row['dtype']} | " + " | ".join(cells)
                     + "".join(f" | {x}" for x in ratios) + f" | {peak} |")
    lines.append("")
    for name, entry in _preprocess_entries(data):
        rates = ", ".join(f"{label} {_fmt(entry[key]['img_per_s'])}" for key, label in PREPROCESS_LABELS
                          if key in entry)
        shares = ", ".join(f"{source} {100 * entry[f'preprocess_share_{source}']:.0f} %"
                           for source in ("arrays", "jpeg") if f"preprocess_share_{source}" in entry)
        alone = ", ".join(f"{source} {100 * entry[f'preprocess_alone_share_{source}']:.0f} %"
                          for source in ("arrays", "jpeg") if f"preprocess_alone_share_{source}" in entry)
        lines += [f"{entry.get('model', name)}, batch {entry.get('batch', '?')} ({entry.get('engine', 'cpuformer')}), "
                  f"images/s: {rates}. Preprocessing share of end-to-end (1 − end-to-end / model only): {shares} "
                  f"(target ≤ {100 * entry.get('target_share', 0.2):.0f} %)"
                  + (f"; preprocess alone over end-to-end: {alone}" if alone else "") + ".", ""]
    return lines


def plot_vision(data: Dict[str, Any], path: str) -> bool:
    """Images/s per engine for each bench_vision.py row and dtype (log scale), and a panel with the
    CLIP embedding's images/s from pixel values, uint8 arrays and JPEG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in vision_rows(data) if any(isinstance(v, float) for v in r["rates"].values())]
    pre = [(name, entry) for name, entry in _preprocess_entries(data) if "model_only" in entry]
    if not rows and not pre:
        return False
    panels = [p for p, present in (("rows", rows), ("pre", pre)) if present]
    sizes = [max(len(rows), 3) if p == "rows" else 2 for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 1.1 * sum(sizes) + 1.5), 5.0), squeeze=False,
                             gridspec_kw={"width_ratios": sizes})
    for ax, panel in zip(axes[0], panels):
        if panel == "rows":
            engines = [e for e in VISION_ENGINES if any(isinstance(r["rates"].get(e), float) for r in rows)]
            width = 0.8 / max(len(engines), 1)
            for i, engine in enumerate(engines):
                xs, ys = [], []
                for g, r in enumerate(rows):
                    value = r["rates"].get(engine)
                    if isinstance(value, float):
                        xs.append(g + (i - (len(engines) - 1) / 2) * width)
                        ys.append(value)
                bars = ax.bar(xs, ys, width, label=engine, color=COLORS.get(engine))
                ax.bar_label(bars, labels=[_fmt(y) for y in ys], fontsize=6, rotation=90, padding=2)
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels([f"{r['model']} · b{r['batch']} · {r['dtype']}" for r in rows], fontsize=7,
                               rotation=35, ha="right", rotation_mode="anchor")
            values = [v for r in rows for v in r["rates"].values() if isinstance(v, float)]
            ax.set_yscale("log")
            ax.set_ylim(10 ** math.floor(math.log10(min(values))), 10 ** (math.log10(max(values)) + 0.35))
            ax.set_title("images/s (higher is better)")
            ax.grid(axis="y", which="both", alpha=0.3)
            ax.legend(fontsize=8)
        else:
            name, entry = pre[-1]
            labels = [(key, label) for key, label in PREPROCESS_LABELS if key in entry]
            ys = [entry[key]["img_per_s"] for key, _ in labels]
            bars = ax.bar(range(len(ys)), ys, 0.6, color=[COLORS["cpuformer"], "#ff9896", "#ff9896"][: len(ys)])
            shares = {"end_to_end_arrays": entry.get("preprocess_share_arrays"),
                      "end_to_end_jpeg": entry.get("preprocess_share_jpeg")}
            ax.bar_label(bars, labels=[_fmt(y) + (f"\n{100 * shares[key]:.0f} % prep." if shares.get(key) is not None
                                                   else "") for y, (key, _) in zip(ys, labels)], fontsize=7)
            ax.set_xticks(range(len(ys)))
            ax.set_xticklabels([label for _, label in labels], fontsize=7, rotation=35, ha="right",
                               rotation_mode="anchor")
            ax.set_ylim(0, max(ys) * 1.25)
            ax.set_title(f"{entry.get('model', name)}\nbatch {entry.get('batch', '?')}: images/s", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None or seconds != seconds else f"{seconds * 1e3:.1f}"


def serve_series(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The decode rows of one bench_serve.py result, per engine: [{"engine", "model", "dtype", "rows"}]
    (a file from before --model / --dtype is GPT-2 float32)."""
    settings = data.get("settings", {})
    model, dtype = settings.get("model", "gpt2"), settings.get("dtype", "float32")
    out = []
    if data.get("decode"):
        out.append({"engine": "cpuformer", "model": model, "dtype": dtype, "rows": data["decode"]})
    peer = data.get("llamacpp") or {}
    if peer.get("decode"):
        out.append({"engine": "llama.cpp", "model": model, "dtype": peer.get("format", "?"), "rows": peer["decode"]})
    return out


def serve_markdown(data: Dict[str, Any]) -> List[str]:
    """The tables of a bench_serve.py result file: per client count and engine, the aggregate
    tokens/s (and its multiple of one client's, and of llama.cpp's), time to first token and
    inter-token latency percentiles; the prefix, embedding and target rows."""
    settings = data.get("settings", {})
    lines: List[str] = []
    mix = settings.get("mix") or {}
    prompt, new = mix.get("prompt_tokens", [16, 64]), mix.get("new_tokens", [32, 64])
    server = settings.get("server") or {}
    lines += [f"{settings.get('model', 'gpt2')} ({settings.get('decoder', '?')}), {settings.get('dtype', 'float32')}: "
              f"each client streams {settings.get('requests_per_client', '?')} requests of {prompt[0]}-{prompt[1]} "
              f"prompt tokens for {new[0]}-{new[1]} new tokens, temperature 0"
              + (f"; cpuformer serve --max-batch {server['max_batch']} --prefill-chunk {server['prefill_chunk']}"
                 + (f" --prefill-slowdown {server['prefill_slowdown']:g}"
                    if server.get("prefill_slowdown") is not None else "")
                 + (f" --kv-cache-dtype {server['kv_cache_dtype']}" if server.get("kv_cache_dtype") else "")
                 if server else "") + (f"; scheduler: {settings['scheduler']}" if settings.get("scheduler") else "")
              + ("; quick run (small model)" if settings.get("quick") else "") + ".", ""]
    series = serve_series(data)
    peer = next((s for s in series if s["engine"] == "llama.cpp"), None)
    peer_rate = {r["clients"]: r["tokens_per_s"] for r in (peer["rows"] if peer else [])}
    if series:
        lines += ["| clients | engine | tokens/s | × 1 client | × llama.cpp | TTFT p50 ms | TTFT p99 ms "
                  "| inter-token p50 ms | inter-token p99 ms | mean batch |", "|---" * 10 + "|"]
        for entry in series:
            single = next((r["tokens_per_s"] for r in entry["rows"] if r["clients"] == 1), None)
            for r in entry["rows"]:
                versus = (f"{r['tokens_per_s'] / peer_rate[r['clients']]:.2f}×"
                          if entry["engine"] == "cpuformer" and peer_rate.get(r["clients"]) else "-")
                lines.append(f"| {r['clients']} | {entry['engine']} {entry['dtype']} | {_fmt(r['tokens_per_s'])} | "
                             + (f"{r['tokens_per_s'] / single:.2f}×" if single else "-") + f" | {versus} | "
                             f"{_ms(r.get('ttft_p50_s'))} | {_ms(r.get('ttft_p99_s'))} | {_ms(r.get('itl_p50_s'))} | "
                             f"{_ms(r.get('itl_p99_s'))} | "
                             + (f"{r['mean_batch']:.1f}" if r.get("mean_batch") is not None else "-") + " |")
        lines.append("")
    for engine, row in (("cpuformer", data.get("prefix")), ("llama.cpp", (data.get("llamacpp") or {}).get("prefix"))):
        if row:
            lines += [f"Shared system prompt ({engine}): {row['system_tokens']} tokens + a "
                      f"{row['suffix_tokens']}-token "
                      f"suffix, {len(row['rounds'])} rounds (medians): time to first token of request 1 "
                      f"{_ms(row['ttft_first_median_s'])} ms, of request 2 (same system prompt, another suffix) "
                      f"{_ms(row['ttft_second_median_s'])} ms: {100 * row['ratio_median']:.0f} % of the first."
                      + (f" Note: {row['note']}." if row.get("note") else ""), ""]
    embed = data.get("embed")
    if embed:
        lines += [f"Embeddings: {embed['requests']} single-sentence requests one by one {embed['sequential_s']:.2f} s, "
                  f"all at once {embed['concurrent_s']:.2f} s: {embed['speedup']:.2f}×.", ""]
    peer_info = data.get("llamacpp") or {}
    for key in ("skipped", "error"):
        if peer_info.get(key):
            lines += [f"llama.cpp {key}: {peer_info[key]}", ""]
    if peer_info.get("server"):
        version = (peer_info.get("version") or {}).get("llama_cpp_python", "?")
        lines += [f"llama.cpp: llama-cpp-python {version} server, {peer_info.get('format', '?')} GGUF of the same "
                  "weights, " + ", ".join(f"{k} {v}" for k, v in peer_info["server"].items()) + ".", ""]
    goals = data.get("targets") or {}
    if goals:
        lines += ["| issue 22 target | value | goal | met |", "|---|---|---|---|"]
        for name, entry in goals.items():
            lines.append(f"| {name.replace('_', ' ')} | {entry['value']:.2f} | {entry['goal']} | "
                         f"{'yes' if entry.get('met') else 'no'} |")
        lines.append("")
    return lines


def plot_serve(files: List[Dict[str, Any]], path: str) -> bool:
    """Aggregate tokens/s and p99 inter-token latency against concurrent clients, one line per
    engine, model and dtype over the bench_serve.py result files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    series = []
    for data in files:
        for s in serve_series(data):
            series.append({**s, "label": f"{s['engine']} {s['model']} {s['dtype']}", "file": id(data),
                           "date": (data.get("machine") or {}).get("date", "?")})
    if not series:
        return False
    labels = [s["label"] for s in series]
    for s in series:  # two files of one engine, model and dtype: their dates tell them apart
        if labels.count(s["label"]) > 1:
            s["label"] += f" ({s['date']})"
    fig, (rate_ax, itl_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
    styles = iter(["-", "--", ":", "-."] * 4)
    style: Dict[int, str] = {}  # one line style per file: ours and llama.cpp of one run share it
    ticks = sorted({r["clients"] for s in series for r in s["rows"]})
    for s in series:
        rows = sorted(s["rows"], key=lambda r: r["clients"])
        clients = [r["clients"] for r in rows]
        line = style.setdefault(s["file"], next(styles))
        for ax, values in ((rate_ax, [r["tokens_per_s"] for r in rows]),
                           (itl_ax, [r["itl_p99_s"] * 1e3 for r in rows])):
            ax.plot(clients, values, marker="o", linestyle=line, label=s["label"], color=COLORS.get(s["engine"]))
    for ax, title in ((rate_ax, "aggregate generated tokens/s (higher is better)"),
                      (itl_ax, "p99 inter-token latency, ms (lower is better)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title, fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


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
    vision = None
    serve = []
    for path, data in files:
        if os.path.basename(path).startswith("vision"):
            vision = data  # the newest one (files are sorted by name, so by date)
        if os.path.basename(path).startswith("serve"):
            serve.append(data)
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
        if vision and plot_vision(vision, os.path.join(out, "vision.png")):
            plots.append("vision.png")
        if serve and plot_serve(serve, os.path.join(out, "serve.png")):
            plots.append("serve.png")
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write(markdown(files, plots))
    print(f"wrote {os.path.join(out, 'REPORT.md')}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
