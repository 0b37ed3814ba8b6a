"""Print the README's shell block marked for CI, so CI runs the commands exactly as written.

    python3 .ci/readme_block.py NAME [README]

A block is marked by the line `<!-- ci: NAME -->` right before its ```bash fence. Exit status
1 (and a line on stderr) when the README has no such block, so CI cannot silently run
nothing after the README changes. tests/launch/test_launch_docs.py uses the same function.
"""
from __future__ import annotations

import sys
from pathlib import Path


def readme_block(readme_text: str, name: str) -> str | None:
    """The body of the fenced block right after ``<!-- ci: name -->``, or None."""
    lines = readme_text.splitlines()
    marker = f"<!-- ci: {name} -->"
    for i, line in enumerate(lines):
        if line.strip() != marker:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            return None
        body = []
        for inner in lines[i + 2:]:
            if inner.startswith("```"):
                return "\n".join(body)
            body.append(inner)
    return None


def main(argv: list[str]) -> int:
    name = argv[1]
    readme = Path(argv[2]) if len(argv) > 2 else Path(__file__).resolve().parents[1] / "README.md"
    block = readme_block(readme.read_text(), name)
    if not block:
        print(f"{readme}: no shell block marked <!-- ci: {name} -->", file=sys.stderr)
        return 1
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
