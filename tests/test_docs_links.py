"""Every relative link in the project's Markdown points at a file that exists, and the README's test
command is the one .ci/run runs.

The README links into docs/ and benchmarks/results/, and those pages link to each other and to
result files; moving or renaming one of them silently breaks the others. Links to a heading
(`file.md#heading`) must also name a heading of that file, slugged as GitHub does.
"""

from __future__ import annotations

import pathlib
import re
from typing import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# `[text](target)` and `![alt](target)`; the target ends at the first space (a title may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    files += sorted((ROOT / "benchmarks" / "results").rglob("*.md"))
    return [path for path in files if path.is_file()]


def prose_lines(text: str, keep_inline_code: bool = False) -> Iterator[tuple[int, str]]:
    """Lines outside fenced code blocks; inline code is removed unless asked for (code is not a
    link, but it is part of a heading's slug)."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, line if keep_inline_code else INLINE_CODE.sub("", line)


def links(text: str) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(text):
        for match in LINK.finditer(line):
            yield number, match.group(1)


def github_slug(heading: str) -> str:
    # GitHub: lowercase, drop everything but word characters, spaces and hyphens (code and
    # emphasis marks go with them), spaces to hyphens. A link in a heading keeps only its text.
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_inline_code=True):
        match = HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def broken_links(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    problems = []
    text = path.read_text(encoding="utf-8")
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http:, https:, mailto: — not checked offline
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: {resolved} does not exist")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{where}: {resolved.name} has no heading #{fragment}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(path: pathlib.Path) -> None:
    assert broken_links(path) == []


def test_readme_is_checked_and_has_links() -> None:
    # Guards the checker itself: a pattern that matched nothing would pass every file.
    readme = ROOT / "README.md"
    assert readme in markdown_files()
    targets = [target for _, target in links(readme.read_text(encoding="utf-8"))]
    assert "docs/precision.md" in targets
    assert "benchmarks/results/README.md" in targets


def test_a_broken_link_is_reported(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading: with `code`\n", encoding="utf-8")
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) [web](https://example.com)\n"
        "`[code](not-a-link.md)`\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "[missing](nowhere.md) ![missing image](img/none.png) [bad anchor](there.md#nope)\n",
        encoding="utf-8",
    )
    problems = broken_links(page, root=tmp_path)
    assert [problem.split(": ")[1] for problem in problems] == [
        "nowhere.md",
        "img/none.png",
        "there.md#nope",
    ]


def test_ci_runs_the_readme_test_command() -> None:
    # The README promises that .ci/run runs exactly its test command; keep the two in step.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci_commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#") and "python -m pytest" in line
    ]
    assert len(ci_commands) == 1, ci_commands
    assert f"```bash\n{ci_commands[0]}\n```" in readme
