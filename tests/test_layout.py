"""The project's layout rules: the runtime never imports benchmarks or matplotlib, code cites only what
is in the repository, and every package's module map names each of its modules."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNTIME = ["tfm_local", "tfm_local.engine", "tfm_local.cli.chat", "tfm_local.cli.serve", "tfm_local.server",
           "tfm_local.cli.train", "tfm_local.decode.step", "tfm_local.files.drafters", "tfm_local.files.models"]


def test_runtime_imports_no_benchmark_and_no_matplotlib():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in RUNTIME)
            + "from tfm_local import Engine, SamplingParams\n"
            + "bad = sorted(m for m in sys.modules if m.startswith(('tfm_local.bench', 'tfm_local.testing', "
              "'matplotlib')))\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "", f"runtime modules pull in {out.stdout.strip()}"


def _code_files():
    for top in ("tfm_local", "convert", "examples", "lab"):
        yield from (ROOT / top).rglob("*.py")
    yield from (p for p in (ROOT / "tests").glob("*.py") if p.name != "test_layout.py")
    for ext in ("*.cpp", "*.h", "*.c", "*.cu", "*.cuh"):
        yield from (ROOT / "ggml_ops" / "src").rglob(ext)
    yield from (ROOT / "ggml_ops").rglob("*.patch")
    yield from (ROOT / "ggml_ops").glob("*.py")
    yield from (ROOT / "requirements").glob("*.txt")
    yield ROOT / "Makefile"


def test_code_cites_only_the_repository():
    """No code file cites a document outside the repository or an issue number no reader can look up."""
    pattern = re.compile(r"shared/|(?<!llama\.cpp )issue #?[0-9]", re.IGNORECASE)  # upstream's issues can be looked up
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in _code_files()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def _packages():
    return sorted(p.parent for p in (ROOT / "tfm_local").rglob("__init__.py"))


@pytest.mark.parametrize("pkg", _packages() + [ROOT / "convert"], ids=lambda p: p.name)
def test_module_map_lists_every_module(pkg):
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    names = [m.stem for m in pkg.glob("*.py") if m.stem != "__init__"]
    names += [d.name for d in pkg.iterdir() if (d / "__init__.py").is_file()]
    missing = [m for m in names if f"``{m}``" not in doc and f"{m}.py" not in doc]
    assert not missing, f"{pkg.name}/__init__.py's module map lacks {missing}"


def test_shipped_drafters_are_where_the_resolver_looks():
    from tfm_local.files.drafters import ASSETS, SHIPPED

    assert SHIPPED and all((ASSETS / name).is_file() for name in SHIPPED.values()), (ASSETS, SHIPPED)


def test_engine_and_step_compare_no_draft_method_names():
    """The engine and the step hold a drafting method object (``decode.methods``): neither compares a
    value with a method's name or tests it against a list of names (the factory parses the option once)."""
    from tfm_local.decode.methods import TREE_SHAPES

    def names(node) -> list[str]:
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in TREE_SHAPES] + \
               [e.id for e in elts if isinstance(e, ast.Name) and e.id.endswith("_SHAPES")]

    hits = [f"{rel}:{node.lineno}" for rel in ("tfm_local/engine.py", "tfm_local/decode/step.py")
            for node in ast.walk(ast.parse((ROOT / rel).read_text()))
            if isinstance(node, ast.Compare) and any(names(x) for x in [node.left, *node.comparators])]
    assert not hits, hits


DATE = re.compile(r"\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b")
#: Files whose comments still hold dated history, to be emptied into docs/notebook/ (budget.py is being
#: rewritten as a policy, and its history moves to docs/notebook/budget-history.md with it).
DATED_COMMENTS_LEFT: set[str] = set()


def _comment_lines(path: Path):
    """(line, text) of a Python file's comments and docstrings (bare string statements); a C/C++
    file's lines with a // or /* comment."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        yield from ((i, line) for i, line in enumerate(text.splitlines(), 1) if "//" in line or "/*" in line
                    or line.lstrip().startswith("*"))
        return
    import io
    import tokenize
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for k, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + k, line


def test_no_date_in_code_comments():
    """History (what was measured when) lives in docs/notebook/; a comment or docstring says what is
    true now, so it carries no date. Data (a date a test writes into a file) is not a comment."""
    files = [p for top in ("tfm_local", "convert", "lab", "examples", "tests") for p in (ROOT / top).rglob("*.py")]
    files += [p for ext in ("*.cpp", "*.h", "*.c", "*.cu", "*.cuh") for p in (ROOT / "ggml_ops" / "src").rglob(ext)]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            if p.relative_to(ROOT).as_posix() not in DATED_COMMENTS_LEFT
            for i, line in _comment_lines(p) if DATE.search(line)]
    assert not hits, "\n".join(hits)
    assert all((ROOT / name).is_file() for name in DATED_COMMENTS_LEFT), "drop a file gone from the list"


def _doc_links():
    pattern = re.compile(r"\]\(([^)\s]+)\)")
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "lab").rglob("*.md"))]:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            for target in pattern.findall(line):
                if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                    yield doc, i, target


def test_docs_links_resolve():
    """Every relative link of the README, docs/ and lab/ names a file or folder of the repository."""
    bad = [f"{doc.relative_to(ROOT)}:{i}: {target}" for doc, i, target in _doc_links()
           if not (doc.parent / target.split("#")[0]).exists()]
    assert not bad, "\n".join(bad)


def _private_reaches(path: Path) -> list[str]:
    """What a script does to the runtime beyond its public hooks: a private attribute read or written
    (``x._name``), ``n_past`` written, or an attribute of a tfm_local module, class or function replaced
    (assigned or ``setattr``: a monkey-patch that depends on how the runtime imports its names)."""
    tree = ast.parse(path.read_text())
    runtime: set[str] = set()  # names the script binds to tfm_local / tfm_convert modules and their members
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            runtime.update((a.asname or a.name).split(".")[0] for a in node.names
                           if a.name.split(".")[0] in ("tfm_local", "tfm_convert"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("tfm_local", "tfm_convert"):
            runtime.update(a.asname or a.name for a in node.names)

    def root(e) -> str | None:
        while isinstance(e, (ast.Attribute, ast.Subscript)):
            e = e.value
        return e.id if isinstance(e, ast.Name) else None

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            hits.append(f"{node.lineno}: private attribute {node.attr}")
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            if isinstance(t, ast.Attribute) and (t.attr == "n_past" or root(t) in runtime):
                hits.append(f"{t.lineno}: writes {ast.unparse(t)}")
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args
                and root(node.args[0]) in runtime):
            hits.append(f"{node.lineno}: {ast.unparse(node)}")
    return hits


def test_lab_scripts_use_public_hooks_only():
    """lab/ measures the runtime through its public API and hooks (``Context.observer``, ``Engine.on_step``,
    ``PhaseClock.observe``, ``Target.rewind`` ...), never its private state or patched module names."""
    hits = [f"{p.relative_to(ROOT)}:{h}" for p in sorted((ROOT / "lab").rglob("*.py")) for h in _private_reaches(p)]
    assert not hits, "\n".join(hits)


def test_the_private_reach_check_finds_each_kind(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import tfm_local.engine as engine_module\nfrom tfm_local.llama import model as llm\n"
                      "from tfm_local.decode.stats import PhaseClock\n"
                      "engine_module.run_step = None\nllm.Context._process = None\nsetattr(PhaseClock, 'mark', None)\n"
                      "eng.target.n_past = 0\nx = eng._auto_for('chain')\n"
                      "eng.on_step = print\neng.target.ctx.observer = None\nPhaseClock.observe(print)\n")
    assert sorted(h.split(":")[0] for h in _private_reaches(script)) == ["4", "5", "5", "6", "7", "8"]
