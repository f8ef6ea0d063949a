"""The documents against the code: nothing they name may drift from what is there.

    check_docs.py [ROOT]              check the repository (exit 1 with every problem found)
    check_docs.py --self-test [ROOT]  also prove each rule fails on a copy broken on purpose

Rules:

1. Configuration: every environment variable the code reads (a string literal in `src/` that
   looks like one) has a row in `docs/configuration.md`, and every variable a row there names
   is read by the code (or by the AWS SDK, or set by Lambda).
2. Links: every relative link in the README, `docs/` and the top-level documents points at a
   file that exists, and its `#anchor`, if any, at a heading of that file.
3. Paths: every path in backticks under `src/`, `tests/`, `scripts/` or `examples/` exists
   (the changelog and the decisions tell history, and may name what is gone).
4. The README stays a front door: at most 250 lines.
5. Decisions: each record under `docs/decisions/` (one file each, `NNNN-title.md`) is numbered
   in order from 1, has a status, and is in the index (`docs/decisions/README.md`).
6. One word per idea: the README's glossary names, beside each word, the synonyms it retires;
   none appears in the documents (history apart) or in the code (`src/`, `tests/`,
   `examples/`, `fuzz/`, `scripts/`): a plain phrase in any case, a name in backticks as
   written.
"""

import os
import re
import sys

# A string literal of the code that looks like a variable but is not a setting.
NOT_SETTINGS = {"OUT_DIR"}  # cargo's build output, for the contracts built in
# Read by the AWS SDK or the CLI tradition rather than by our code.
SDK_VARIABLES = {"AWS_REGION", "AWS_ENDPOINT_URL", "AWS_PROFILE"}
VARIABLE = re.compile(r'"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"')
DOCUMENTS = ["README.md", "CHANGELOG.md", "VERIFICATION.md", "BENCHMARKS.md", "events/README.md"]
README_MAX_LINES = 250
DECISIONS = os.path.join("docs", "decisions")
INDEX = os.path.join(DECISIONS, "README.md")


def is_history(path):
    """The changelog and the decisions tell history, and may name what is gone."""
    return path == "CHANGELOG.md" or path.startswith(DECISIONS + os.sep)


def code_variables(root):
    """Each variable name a non-test source file of `src/` holds as a string literal."""
    found = set()
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        if os.sep + "testing" in dirpath:
            continue
        for name in files:
            if not name.endswith(".rs") or name == "tests.rs":
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                text = f.read()
            # Unit tests at the end of a file name variables they set, not ones the code reads.
            text = text.split("#[cfg(test)]")[0]
            found.update(VARIABLE.findall(text))
    return found - NOT_SETTINGS


def documented_variables(text):
    """The variables the first column of each table row of the configuration names."""
    names = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = line.split("|")
        for cell in cells[1:3]:
            names.update(n for n in re.findall(r"`([A-Z][A-Z0-9_*]+)`", cell) if "_" in n)
    return names


def check_configuration(code, doc_text):
    documented = documented_variables(doc_text)
    exact = {n for n in documented if "*" not in n}
    patterns = [re.compile("^" + n.replace("*", "[A-Z0-9_]+") + "$") for n in documented - exact]
    problems = []
    for name in sorted(code - exact):
        if not any(p.match(name) for p in patterns):
            problems.append(f"docs/configuration.md: {name} is read by the code but has no row")
    for name in sorted(exact - code - SDK_VARIABLES):
        if not name.startswith("AWS_LAMBDA_"):
            problems.append(f"docs/configuration.md: {name} has a row but the code never reads it")
    return problems


def anchor(heading):
    """GitHub's anchor for a heading."""
    h = heading.strip().lower().replace("`", "")
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(text):
    """The anchors of a markdown text's headings, outside code blocks."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    return {anchor(m) for m in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def documents(root):
    """The documents checked: the top-level ones and everything in docs/."""
    paths = [p for p in DOCUMENTS if os.path.exists(os.path.join(root, p))]
    paths += sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
    paths += sorted(os.path.join(DECISIONS, n) for n in os.listdir(os.path.join(root, DECISIONS)) if n.endswith(".md"))
    return paths


def check_links(root, path, text):
    problems = []
    base = os.path.dirname(path)
    prose = re.sub(r"(?ms)^```.*?^```", "", text)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        file, _, frag = target.partition("#")
        dest = os.path.normpath(os.path.join(base, file)) if file else path
        full = os.path.join(root, dest)
        if not os.path.exists(full):
            problems.append(f"{path}: link to {target}, which does not exist")
            continue
        if frag and dest.endswith(".md"):
            with open(full, encoding="utf-8") as f:
                if frag not in anchors(f.read()):
                    problems.append(f"{path}: link to {target}, no such heading")
    if is_history(path):
        return problems
    for ref in re.findall(r"`((?:src|tests|scripts|examples)/[A-Za-z0-9_./-]+)`", prose):
        if not os.path.exists(os.path.join(root, ref.rstrip("/."))):
            problems.append(f"{path}: names {ref}, which does not exist")
    return problems


CODE_DIRS = ["src", "tests", "examples", "fuzz", "scripts"]
GLOSSARY = re.compile(r"(?ms)^## Glossary\n(.*?)(?=^## )")


def retired(readme):
    """The synonyms the README's glossary retires: (pattern, what to say instead)."""
    section = GLOSSARY.search(readme)
    found = []
    for row in (section.group(1) if section else "").splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("word", "---"):
            continue
        for term in filter(None, (t.strip() for t in cells[2].split(","))):
            name = term.strip("`")
            flags = 0 if term.startswith("`") else re.IGNORECASE
            found.append((re.compile(r"(?<![\w:])" + re.escape(name) + r"(?!\w)", flags), name, cells[0]))
    return found


def code_texts(root):
    """Every source file of the code, by path."""
    texts = {}
    for top in CODE_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("target", "corpus", "artifacts")]
            for name in files:
                if name.endswith((".rs", ".py", ".sh")):
                    path = os.path.relpath(os.path.join(dirpath, name), root)
                    texts[path] = read(root, path)
    return texts


def check_words(texts, sources):
    """No retired synonym (rule 6) in a document that is not history, or in the code."""
    readme = texts["README.md"]
    words = retired(readme)
    problems = []
    for path, text in list(texts.items()) + list(sources.items()):
        if is_history(path):
            continue
        if path == "README.md":
            text = GLOSSARY.sub("", text)
        for pattern, name, word in words:
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path}:{line}: '{name}' is retired; the glossary says '{word}'")
    return problems


def check_readme(text):
    n = len(text.splitlines())
    return [f"README.md: {n} lines, more than {README_MAX_LINES}"] if n > README_MAX_LINES else []


def check_decisions(texts):
    """The records (`texts`: path -> text of every document) against their index."""
    problems = []
    index = texts.get(INDEX, "")
    records = sorted(
        (int(m.group(1)), path)
        for path in texts
        if path.startswith(DECISIONS + os.sep)
        for m in [re.match(r"(\d{4})-[a-z0-9_-]+\.md$", os.path.basename(path))]
        if m
    )
    others = [p for p in texts if p.startswith(DECISIONS + os.sep) and p != INDEX
              and not re.match(r"\d{4}-[a-z0-9_-]+\.md$", os.path.basename(p))]
    for path in others:
        problems.append(f"{path}: a record not named NNNN-title.md")
    if [n for n, _ in records] != list(range(1, len(records) + 1)):
        problems.append(f"{DECISIONS}: records are not numbered 1, 2, 3, ... in order")
    for n, path in records:
        text = texts[path]
        if not re.match(rf"# {n}\. .+", text):
            problems.append(f"{path}: its heading is not '# {n}. <title>'")
        if not re.search(r"(?m)^Status: ", text):
            problems.append(f"{path}: no status")
        if f"]({os.path.basename(path)})" not in index:
            problems.append(f"{path}: not in the index")
    return problems


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def check(root, texts=None, code=None, sources=None):
    """Every problem found; `texts`, `code` and `sources` replace what is read from disk
    (self-test)."""
    texts = dict(texts or {})
    for path in documents(root):
        texts.setdefault(path, read(root, path))
    sources = code_texts(root) if sources is None else sources
    code = code_variables(root) if code is None else code
    problems = check_configuration(code, texts["docs/configuration.md"])
    for path, text in texts.items():
        problems += check_links(root, path, text)
    problems += check_readme(texts["README.md"])
    problems += check_decisions(texts)
    problems += check_words(texts, sources)
    return problems


def self_test(root):
    """Each rule must fail on a copy broken on purpose."""
    config = read(root, "docs/configuration.md")
    readme = read(root, "README.md")
    names = sorted(n for n in os.listdir(os.path.join(root, DECISIONS)) if n[:4].isdigit())
    first = os.path.join(DECISIONS, names[0])
    last = int(names[-1][:4])
    record = read(root, first)
    breaks = {
        "a variable the code reads, not documented": ({}, code_variables(root) | {"NEW_SETTING_X"}),
        "a documented variable nobody reads": (
            {"docs/configuration.md": config + "\n| `STALE_SETTING` | 1 | gone |\n"}, None),
        "a broken link": ({"README.md": readme + "\n[x](docs/missing.md)\n"}, None),
        "a broken anchor": ({"README.md": readme + "\n[x](docs/protocol.md#no-such-part)\n"}, None),
        "a missing path": ({"README.md": readme + "\n`src/no_such_file.rs`\n"}, None),
        "a long README": ({"README.md": readme + "\n" * README_MAX_LINES}, None),
        "a decision without a status": (
            {first: record.replace("\nStatus: ", "\nState: ", 1)}, None),
        "a decision out of order": (
            {os.path.join(DECISIONS, f"{last + 2:04d}-extra.md"): "# %d. Extra\n\nStatus: accepted.\n" % (last + 2)},
            None),
        "a decision not in the index": (
            {os.path.join(DECISIONS, f"{last + 1:04d}-extra.md"): "# %d. Extra\n\nStatus: accepted.\n" % (last + 1)},
            None),
    }
    failures = []
    for rule, (texts, code) in breaks.items():
        if not check(root, texts, code):
            failures.append(f"self-test: {rule} was not caught")
    words = retired(readme)
    if not words:
        failures.append("self-test: the glossary retires no word")
    for pattern, name, _ in words[:3]:
        stale = {"src/stale.rs": f"/// The {name} of a job.\n"}
        if not check(root, None, None, {**code_texts(root), **stale}):
            failures.append(f"self-test: the retired '{name}' in the code was not caught")
    return failures


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..")
    problems = check(root)
    if "--self-test" in argv:
        problems += self_test(root)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"docs: {len(code_variables(root))} variables documented, links and paths resolve, no retired word")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
