"""The library's module layout: no import cycle, and every dependency points down.

    check_layout.py [SRC]              check src/ (exit 1 with every problem found)
    check_layout.py --self-test [SRC]  also prove each rule fails on a broken tree

A file's dependencies are the modules its `crate::` and `super::` paths name (a `use` line or a
path in code), each resolved to the deepest module file that exists. Four rules:

1. No cycle between files. A module naming its own ancestor is left out: a parent declares its
   children and shares its types with them (a facade), which is not a cycle of design.
2. Floors: a top-level module imports only from its own floor or the floors below it.
3. A file of `src/` has at most 600 lines before its unit tests, and no excuse: a longer one
   is split. A test or example file over about 650 lines says why in its `//!` header, with a
   line starting `Why this file is long:`.
4. A function of the library or a binary (unit tests aside) has at most 80 lines, and no
   comment in `src/` excuses a longer one (`Why this function is long:`, `Why this file is
   long:`): a longer one is split.
"""

import os
import re
import shutil
import sys
import tempfile

# Bottom first. A module on floor N may import from floors 0..=N (cycles aside).
FLOORS = [
    ["job", "clock", "vars"],  # pure logic, injected time, reading settings
    ["ledger", "provider", "queue", "blobs", "events"],  # the outside systems, each behind a trait
    ["report", "telemetry"],  # what a run did, as plain data; what a trace says
    ["protocol"],  # the delivery protocol, pure: the machines the worker and the model checker drive
    ["worker", "ops"],  # the function, and the operations around it
    ["config", "logs", "testing"],  # assembly, set-up, test support
]

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\};", re.S)


def module_of(src, path):
    """`src/ledger/dynamodb/mod.rs` -> ("ledger", "dynamodb")."""
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel == ["lib"]:
        return ()
    return tuple(rel)


def modules(src):
    found = {}
    for root, dirs, files in os.walk(src):
        if os.path.relpath(root, src).split(os.sep)[0] == "bin":
            continue
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(root, f)
                found[module_of(src, path)] = path
    return found


def strip_comments_and_tests(text):
    text = re.sub(r"//[^\n]*", "", text)
    # Unit tests may reach anywhere in the crate; they are not part of the layout.
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    return text[: cut.start()] if cut else text


def paths_in(text):
    """Every `crate::a::b` / `super::a` path, group imports expanded."""
    for m in GROUP.finditer(text):
        root, prefix, inner = m.group(1), m.group(2), m.group(3)
        for part in re.split(r",", re.sub(r"\{[^}]*\}", "", inner)):
            part = part.strip().split(" as ")[0].strip()
            if part and part != "self":
                yield root, [p for p in (prefix + "::" + part).split("::") if p]
            elif part == "self":
                yield root, [p for p in prefix.split("::") if p]
    for m in PATH.finditer(text):
        yield m.group(1), [p for p in m.group(2).split("::") if p]


def resolve(mods, here, root, parts):
    if root == "crate":
        base = ()
    else:
        base = here[:-1]
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    best = None
    for i in range(len(parts) + 1):
        candidate = base + tuple(parts[:i])
        if candidate in mods:
            best = candidate
    return best


def graph(src):
    mods = modules(src)
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            text = strip_comments_and_tests(f.read())
        for root, parts in paths_in(text):
            target = resolve(mods, m, root, parts)
            if target is None or target == m or m[: len(target)] == target:
                continue  # itself, or an ancestor (the facade that declares it)
            edges[m].add(target)
    return edges


def cycles(edges):
    """Every strongly connected component with more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def floor_of(module):
    for n, names in enumerate(FLOORS):
        if module and module[0] in names:
            return n
    return None


def name(m):
    return "::".join(m) or "crate"


LONG = 650
LONG_REASON = "Why this file is long:"


SRC_LONG = 600
EXCUSE = re.compile(r"Why this (?:function|file) is long:")


def before_tests(source):
    """The part of a file before its unit tests (`#[cfg(test)] mod tests {`), or all of it."""
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", source)
    return source[: cut.start()] if cut else source


def long_src_files(src):
    """(path, lines) of each file of src/ longer than SRC_LONG before its unit tests."""
    root = os.path.dirname(os.path.abspath(src))
    for base, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs") and f != "tests.rs":
                path = os.path.join(base, f)
                with open(path, encoding="utf-8") as text:
                    n = before_tests(text.read()).count("\n")
                if n > SRC_LONG:
                    yield os.path.relpath(path, root), n


def excuses(src):
    """(path, line) of each comment in src/ that excuses a long file or function."""
    root = os.path.dirname(os.path.abspath(src))
    for base, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(base, f)
                with open(path, encoding="utf-8") as text:
                    for i, line in enumerate(text.read().split("\n")):
                        if EXCUSE.search(line) and line.lstrip().startswith("//"):
                            yield os.path.relpath(path, root), i + 1


def long_files(src):
    """(path, lines) of each test or example file over LONG lines without its reason."""
    root = os.path.dirname(os.path.abspath(src))
    for folder in ("tests", "examples"):
        for base, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                if not f.endswith(".rs"):
                    continue
                path = os.path.join(base, f)
                with open(path, encoding="utf-8") as text:
                    lines = text.read().split("\n")
                header = [line[3:].strip() for line in lines if line.startswith("//!")]
                if len(lines) > LONG and not any(h.startswith(LONG_REASON) for h in header):
                    yield os.path.relpath(path, root), len(lines)


FN_LONG = 80
FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")
LITERALS = re.compile(r'r(#*)"[\s\S]*?"\1|"(?:\\[\s\S]|[^"\\])*"|\'(?:\\[^\']+|[^\'\\])\'|//[^\n]*')


def long_functions(src):
    """(path, line, name, lines) of each function of src/ over FN_LONG lines."""
    root = os.path.dirname(os.path.abspath(src))
    for base, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs") or f == "tests.rs":
                continue
            path = os.path.join(base, f)
            with open(path, encoding="utf-8") as text:
                source = text.read()
            cut = re.search(r"#\[cfg\(test\)\]\s*mod tests", source)
            source = source[: cut.start()] if cut else source
            lines = source.split("\n")
            # Braces counted with strings, characters and comments blanked (lines kept).
            code = LITERALS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source).split("\n")
            for i, line in enumerate(lines):
                m = FN.match(line)
                if not m:
                    continue
                depth, opened, end = 0, False, None
                for j in range(i, len(code)):
                    for ch in code[j]:
                        if ch == "{":
                            depth, opened = depth + 1, True
                        elif ch == "}":
                            depth -= 1
                    if opened and depth == 0:
                        end = j
                        break
                    if not opened and code[j].rstrip().endswith(";"):
                        break  # a declaration without a body
                if end is None or end - i + 1 <= FN_LONG:
                    continue
                yield os.path.relpath(path, root), i + 1, m.group(1), end - i + 1


def check(src):
    edges = graph(src)
    problems = []
    for path, line, fn, n in long_functions(src):
        problems.append(f"{path}:{line}: fn {fn} has {n} lines, more than {FN_LONG}: split it")
    for path, n in long_src_files(src):
        problems.append(f"{path}: {n} lines before its unit tests, more than {SRC_LONG}: split it")
    for path, line in excuses(src):
        problems.append(f"{path}:{line}: a comment excuses a long file or function: split it instead")
    for path, n in long_files(src):
        problems.append(f"{path}: {n} lines, and its header does not say why ({LONG_REASON})")
    for component in cycles(edges):
        problems.append("import cycle: " + " -> ".join(name(m) for m in component))
    for m, targets in sorted(edges.items()):
        if m and floor_of(m) is None:
            problems.append(f"{name(m)}: top-level module on no floor (add it to FLOORS)")
            continue
        for t in sorted(targets):
            if m and t and m[0] != t[0] and floor_of(t) is not None and floor_of(t) > floor_of(m):
                problems.append(f"{name(m)} imports {name(t)}, a floor above it")
    return problems


def self_test(src):
    """Each rule must fail on a tree broken on purpose."""
    breaks = {
        "cycle": ("ledger/memory.rs", "use crate::ledger::dynamodb::DynamoLedger;\n",
                  "ledger/dynamodb/mod.rs", "use crate::ledger::memory::InMemoryLedger;\n"),
        "upward": ("job/mod.rs", "use crate::worker::Settings;\n", None, None),
        "long": ("vars.rs", "\n" * SRC_LONG, None, None),
        "excuse": ("vars.rs", "// Why this function is long: on purpose.\n", None, None),
        "long fn": ("vars.rs", "fn long_on_purpose() {\n" + "    let _ = \"}\";\n" * FN_LONG + "}\n", None, None),
    }
    failures = []
    for rule, (f1, line1, f2, line2) in breaks.items():
        tmp = tempfile.mkdtemp()
        try:
            copy = os.path.join(tmp, "src")
            shutil.copytree(src, copy)
            for f, line in ((f1, line1), (f2, line2)):
                if f:
                    path = os.path.join(copy, f)
                    with open(path, encoding="utf-8") as old:
                        text = old.read()
                    with open(path, "w", encoding="utf-8") as out:
                        out.write(line + text)
            found = check(copy)
            wanted = {
                "cycle": "import cycle",
                "upward": "a floor above it",
                "long": "before its unit tests",
                "excuse": "excuses a long file",
                "long fn": "more than",
            }[rule]
            if not any(wanted in p for p in found):
                failures.append(f"self-test: the {rule} rule did not catch a broken tree")
        finally:
            shutil.rmtree(tmp)
    return failures


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    src = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src")
    problems = check(src)
    if "--self-test" in argv:
        problems += self_test(src)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"layout: {len(graph(src))} modules, no cycle, every import points down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
