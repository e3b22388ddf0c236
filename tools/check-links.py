#!/usr/bin/env python3
"""Fails when a relative link in the repository's Markdown points at no file, or at an anchor
the target page does not have (anchors as GitHub makes them from headings). Run by
`make check-docs`; prints each broken link with its file and line."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        in_code = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("```"):
                    in_code = not in_code
                if in_code or not line.startswith("#"):
                    continue
                base = slug(line.lstrip("#"))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def markdown_files():
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return [os.path.join(ROOT, p) for p in listed]


def main():
    broken = []
    for path in markdown_files():
        in_code = False
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.startswith("```"):
                    in_code = not in_code
                if in_code:
                    continue
                for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                    target = match.group(1) or match.group(2)
                    if re.match(r"^[a-z]+:", target) or target.startswith("<"):
                        continue
                    file_part, _, anchor = target.partition("#")
                    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                    where = f"{os.path.relpath(path, ROOT)}:{number}: {target}"
                    if not resolved.startswith(ROOT):
                        continue  # beside the repository (../shared): not ours to check
                    if not os.path.exists(resolved):
                        broken.append(f"{where}: no such file")
                    elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                        broken.append(f"{where}: no heading makes #{anchor}")
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} broken link(s); fix the link or the heading", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
