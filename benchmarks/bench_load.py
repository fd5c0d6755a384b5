"""Load plus first token of a converted directory, with and without its packed-weights file.

Each timing is a fresh process: `cf.load(directory)` then `generate` of one new token after a
short prompt; the time from just before `cf.load` (after `import cpuformer`) to the returned token
is reported, and the load alone. The two variants alternate, round after round, so a shared host's
slow moments hit both:

  plain   the directory without cpuformer_packed.<level>.bin: every weight is packed at load into
          freshly allocated memory (what converted directories from before the packed files do)
  packed  the same files plus the packed-weights file of the running level: the weights are mapped

Both are built under --work from SRC without changing it: hard links to SRC's files (symbolic
links across file systems), and for `packed` the file `cpuformer pack` writes (kept between runs).
The page cache is warm for both after the first round (each variant's first round is reported
but left out of the medians). With --decode N each child also times N more tokens (tok/s), to see
that file-backed pages decode as fast as anonymous (huge) pages.

    python benchmarks/bench_load.py SRC [SRC ...] [--rounds 5] [--threads 2] [--decode 0]
                                    [--work DIR] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKED_PREFIX = "cpuformer_packed."


def child(directory: str, threads: int, decode: int) -> int:
    """One timing in this (fresh) process; prints a JSON line."""
    import cpuformer as cf

    start = time.perf_counter()
    model = cf.load(directory, num_threads=threads)
    loaded = time.perf_counter()
    model.generate([[5, 6, 7, 8]], max_new_tokens=1, min_new_tokens=1, eos_token_id=[])
    first = time.perf_counter()
    out = {"load_s": loaded - start, "first_token_s": first - start,
           "packed": bool(getattr(model._model, "packed_weights", None))}
    if decode:
        begin = time.perf_counter()
        model.generate([[5, 6, 7, 8]], max_new_tokens=decode, min_new_tokens=decode, eos_token_id=[])
        out["tok_per_s"] = decode / (time.perf_counter() - begin)
    print(json.dumps(out))
    return 0


def _link_tree(src: str, dst: str) -> None:
    """dst: src's files (not its packed-weights files), hard-linked (symlinked across devices)."""
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name.startswith(PACKED_PREFIX) or os.path.exists(os.path.join(dst, name)):
            continue
        source = os.path.realpath(os.path.join(src, name))
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(dst, name))
            continue
        try:
            os.link(source, os.path.join(dst, name))
        except OSError:
            os.symlink(source, os.path.join(dst, name))


def prepare(src: str, work: str) -> dict:
    """{"plain": dir, "packed": dir} for the converted directory src."""
    from cpuformer.models._packed import packed_file_name, write_packed_file

    base = os.path.join(work, os.path.basename(os.path.normpath(src)))
    dirs = {"plain": base + "-plain", "packed": base + "-packed"}
    for directory in dirs.values():
        _link_tree(src, directory)
    if not os.path.exists(os.path.join(dirs["packed"], packed_file_name())):
        print(f"cpuformer pack {dirs['packed']} ...", flush=True)
        write_packed_file(dirs["packed"])
    return dirs


def run_child(directory: str, args) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", directory, "--threads", str(args.threads),
               "--decode", str(args.decode)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", nargs="*", help="converted directories (cpuformer convert)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode", type=int, default=0, help="also time this many decoded tokens (tok/s)")
    parser.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "cpuformer", "bench_load"))
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.threads, args.decode)
    if not args.src:
        parser.error("give at least one converted directory")
    results = {}
    for src in args.src:
        dirs = prepare(src, args.work)
        rows = {name: [] for name in dirs}
        for r in range(args.rounds):
            order = list(dirs) if r % 2 == 0 else list(reversed(list(dirs)))
            for name in order:
                row = run_child(dirs[name], args)
                if row["packed"] != (name == "packed"):
                    raise RuntimeError(f"{dirs[name]}: the packed-weights file was {'' if row['packed'] else 'not '}"
                                       "used")
                rows[name].append(row)
                print(f"{os.path.basename(src)} round {r} {name:6s} load {row['load_s']:.3f} s, first token "
                      f"{row['first_token_s']:.3f} s" + (f", {row['tok_per_s']:.2f} tok/s" if args.decode else ""),
                      flush=True)
        summary = {}
        for name, entries in rows.items():
            warm = entries[1:] or entries
            summary[name] = {key: statistics.median(e[key] for e in warm)
                             for key in ("load_s", "first_token_s", "tok_per_s") if key in warm[0]}
            print(f"{os.path.basename(src)} {name:6s} medians (rounds 2..): " +
                  ", ".join(f"{k} {v:.3f}" for k, v in summary[name].items()), flush=True)
        results[src] = {"rounds": rows, "medians": summary}
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
