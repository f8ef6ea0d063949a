"""The declared `rust-version` covers every locked dependency's own `rust-version`.

    check_msrv.py                 check (exit 1 naming the dependencies that need more)
    check_msrv.py --self-test     also prove the check fails for a declared version too low
"""

import json
import re
import subprocess
import sys


def version(text):
    return tuple(int(part) for part in (text.split(".") + ["0", "0"])[:3])


def needing_more(declared, packages):
    return sorted(
        f"{p['name']} {p['version']} needs Rust {p['rust_version']}"
        for p in packages
        if p.get("rust_version") and version(p["rust_version"]) > version(declared)
    )


def main():
    with open("Cargo.toml", encoding="utf-8") as f:
        declared = re.search(r'^rust-version = "([^"]+)"', f.read(), re.M).group(1)
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = metadata["packages"]
    found = needing_more(declared, packages)
    if "--self-test" in sys.argv and not found and not needing_more("1.0", packages):
        found = ["self-test: a declared Rust 1.0 was not caught"]
    for line in found:
        print(f"rust-version {declared}: {line}")
    if not found:
        newest = max((p["rust_version"] for p in packages if p.get("rust_version")), key=version)
        print(f"rust-version {declared}: covers the lock (its newest need is {newest})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
