"""The docs against the code: every relative link resolves, every function and test docs/backprop.md names exists
where its link points, every backward pass has its section, the math avoids GitHub's rendering traps, and the
README keeps its shape (at most 150 lines, opening with the two commands, the test command being .ci/run's)."""
import ast
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BACKPROP = ROOT / "docs" / "backprop.md"
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[([^\[\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")    # [text](target "title"), ![alt](src)
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)                   # [label]: target
HTML_REF = re.compile(r"<[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.I)          # <img src="..."> <a href=...>
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")                                        # http:, https:, mailto:
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
NAME = re.compile(r"^`?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`?$")      # layernorm_backward, GPT.backward


def without_fences(text):
    """text with the lines of fenced code blocks (fences included) blanked, so line numbers stay."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def fenced_blocks(text):
    """[(first line number, [lines inside])] of the fenced code blocks, in order."""
    blocks, fence = [], None
    for i, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            blocks.append((i, []))
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            else:
                blocks[-1][1].append(line)
    return blocks


def links(md):
    """[(line number, text, target)] of every link and image of a markdown file outside code blocks."""
    found = []
    for i, line in enumerate(without_fences(md.read_text(encoding="utf-8")).splitlines(), 1):
        found += [(i, m.group(1), m.group(2)) for m in LINK.finditer(line)]
        found += [(i, "", m.group(1)) for m in REF_DEF.finditer(line)]
        found += [(i, "", m.group(1)) for m in HTML_REF.finditer(line)]
    return found


def local_target(md, target):
    """The file a relative link points at (anchor and query dropped), or None for a URL or a pure #anchor."""
    if not target or target.startswith("#") or SCHEME.match(target):
        return None
    path = unquote(re.split(r"[#?]", target, maxsplit=1)[0])
    return (ROOT / path.lstrip("/")) if path.startswith("/") else (md.parent / path)


# ----------------------------------------------------------------------------
# 1. every relative link in README.md and docs/*.md points at a file of the repository

@pytest.mark.parametrize("md", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(md):
    broken = []
    for line, _, target in links(md):
        path = local_target(md, target)
        if path is None:
            continue
        path = path.resolve()
        if not path.exists() or ROOT not in (path, *path.parents):      # outside the repo: broken on GitHub
            broken.append(f"{md.name}:{line}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# ----------------------------------------------------------------------------
# 2. every function and test docs/backprop.md names in a link exists in the file the link points at

def definitions(py):
    """Every name a module defines: functions, classes, module- and class-level assignments (linear_relu2_backward =
    linear_gelu_backward), methods as Class.method."""
    names = set()

    def walk(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(prefix + n.id for n in ast.walk(target) if isinstance(n, ast.Name))

    walk(ast.parse(py.read_text(encoding="utf-8"), str(py)).body, "")
    return names


def named_links(md=BACKPROP):
    """[(line, name, file)] of the links whose text names a definition of the .py file they point at: the text is
    an identifier or Class.method (in backticks or not, with or without "()"), not a file name (layers.py)."""
    out = []
    for line, text, target in links(md):
        path = local_target(md, target)
        m = NAME.match(text.strip())
        if path is not None and path.suffix == ".py" and m and not m.group(1).endswith(".py"):
            out.append((line, m.group(1), path.resolve()))
    return out


def test_backprop_names_functions_and_tests_that_exist():
    named = named_links()
    assert len(named) >= 40, f"only {len(named)} links to functions and tests: is the link syntax still parsed?"
    missing = [f"docs/backprop.md:{line}: {name} is not defined in {path.relative_to(ROOT)}"
               for line, name, path in named if not path.exists() or name not in definitions(path)]
    assert not missing, "\n".join(missing)


def sections(md=BACKPROP):
    """{'## heading': (first line, last line)} of the second-level sections."""
    lines = md.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(without_fences("\n".join(lines)).splitlines(), 1) if line.startswith("## ")]
    return {lines[s - 1]: (s, e - 1) for s, e in zip(starts, starts[1:] + [len(lines) + 1])}


def test_every_backprop_section_links_its_code_and_its_test():
    named, secs = named_links(), sections()
    assert len(secs) >= 8, f"docs/backprop.md has {len(secs)} '## ' sections"
    lacking = []
    for heading, (first, last) in secs.items():
        here = [path for line, _, path in named if first <= line <= last]
        for what, folder in (("code", ROOT / "minigpt"), ("a test", ROOT / "tests")):
            if not any(folder in path.parents for path in here):
                lacking.append(f"{heading!r} links no function in {folder.name}/ ({what})")
    assert not lacking, "\n".join(lacking)


def test_backprop_derives_every_backward():
    """A new backward in layers.py, model.py or the numpy backend (the specification) needs its derivation."""
    linked = {(path, name) for _, name, path in named_links()}
    missing = []
    for rel in ("minigpt/layers.py", "minigpt/model.py", "minigpt/backends/numpy_ops.py"):
        path = (ROOT / rel).resolve()
        missing += [f"{name} ({rel})" for name in sorted(definitions(path))
                    if name.split(".")[-1].endswith("backward") and (path, name) not in linked]
    assert not missing, "backward passes docs/backprop.md does not link: " + ", ".join(missing)


# ----------------------------------------------------------------------------
# GitHub renders $...$ and $$...$$ after some markdown processing of their inside: keep clear of what it eats

MATH_TRAPS = [
    (re.compile(r"\\[!-/:-@\[\\\]^`{|}~]"), "a backslash before punctuation (\\, \\{ \\\\ ...): markdown eats it "
                                           "(\\_ is the one allowed escape)"),
    (re.compile(r"(?<=[^\w\\\s])_|(?<=\s)_|^_"), "an underscore after punctuation or space, which can open emphasis "
                                                "(write x_i, not \\hat{x}_i: \\hat x_i)"),
    (re.compile(r"\*"), "an asterisk (emphasis): use \\ast or \\cdot"),
    (re.compile(r"<[A-Za-z/!?]"), "'<' before a letter reads as an HTML tag: use \\lt or a space"),
    (re.compile(r"\]\("), "'](' reads as a link"),
]


def math_spans(md=BACKPROP):
    """[(line, text)] of the display blocks and inline spans; asserts the delimiters' form on the way."""
    spans, block = [], None
    for i, line in enumerate(without_fences(md.read_text(encoding="utf-8")).splitlines(), 1):
        if "$$" in line:
            assert line.strip() == "$$", f"docs/backprop.md:{i}: $$ must be alone on its line"
            if block is None:
                block = []                                  # opens
            else:
                spans.append((i, " ".join(block)))          # closes
                block = None
            continue
        if block is not None:
            assert line.strip(), f"docs/backprop.md:{i}: a blank line inside a $$ block ends it on GitHub"
            block.append(line)
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        assert prose.count("$") % 2 == 0, f"docs/backprop.md:{i}: inline math must open and close on one line"
        for m in re.finditer(r"\$([^$]*)\$", prose):
            assert m.group(1) == m.group(1).strip() and m.group(1), f"docs/backprop.md:{i}: $ x $ is not math"
            spans.append((i, m.group(1)))
    assert block is None, "docs/backprop.md: a $$ block is not closed"
    return spans


def test_backprop_math_renders_on_github():
    spans = math_spans()
    assert len(spans) > 100, f"only {len(spans)} math spans found"
    bad = [f"docs/backprop.md:{line}: {why}: {text}" for line, text in spans
           for trap, why in MATH_TRAPS if trap.search(text)]
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------
# 3. the README: short, and opening with the two commands, the test command being what CI runs

def test_readme_is_at_most_150_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 150, f"README.md has {n} lines; at most 150 (the rest belongs in docs/)"


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    text = README.read_text(encoding="utf-8")
    blocks = fenced_blocks(text)
    first_section = next((i for i, line in enumerate(without_fences(text).splitlines(), 1)
                          if line.startswith("## ")), len(text.splitlines()) + 1)
    assert len(blocks) >= 2 and blocks[1][0] < first_section, "README.md opens with two code blocks, before a section"
    train, test = ([line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
                   for _, lines in blocks[:2])
    assert len(train) == 1 and "pip install" in train[0] and "train_shakespeare" in train[0], train
    assert len(test) == 1 and "pip install" in test[0] and "pytest" in test[0], test
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert test[0] == ci[-1], f"README's test command {test[0]!r} is not the last line of .ci/run {ci[-1]!r}"
