#!/usr/bin/env python3
"""Extracts the C++ blocks of gradcomp's markdown files into compilable sources.

A block is a fence that opens with ```cpp at the start of a line. Words after
`cpp` on the fence line are attributes:

  ```cpp                        a whole program: compiled and run (exit 0)
  ```cpp fragment=NAME          spliced into tests/docs/programs/NAME.cpp at the
                                line `// @snippet`, then compiled and run
  ```cpp requires=mpi np=2      needs gradcomp::mpi; run under mpiexec -n 2
  ```cpp requires=thrust        needs gradcomp::thrust
  ```cpp requires=zlib          needs gradcomp::lgc (zlib)

Writes OUT/<name>.cpp per block and OUT/snippets.cmake, a list of
gradcomp_doc_snippet(<name> <markdown:line> <requires> <np>) calls.
Exits non-zero on an unknown attribute, a missing program or marker, or an
unterminated block, so a typo in the docs cannot make a block silently vanish.
"""
import pathlib
import re
import sys


def fail(message):
    print(f"extract_snippets: {message}", file=sys.stderr)
    sys.exit(1)


def blocks(path):
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```cpp"):
            attrs = line[len("```cpp"):].split()
            start = i + 1
            j = start
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            if j == len(lines):
                fail(f"{path}:{i + 1}: unterminated ```cpp block")
            yield i + 1, attrs, "\n".join(lines[start:j]) + "\n"
            i = j
        i += 1


def main():
    source, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    files = [source / "README.md"] + sorted((source / "docs").glob("*.md"))
    files += sorted(p for p in (source / "examples").rglob("README.md"))
    files += sorted(p for p in (source / "python").rglob("*.md")) if (source / "python").exists() else []
    programs = source / "tests" / "docs" / "programs"
    calls = []
    for md in files:
        rel = md.relative_to(source).as_posix()
        for line, attrs, code in blocks(md):
            options = {"fragment": "", "requires": "none", "np": "1"}
            for a in attrs:
                key, _, value = a.partition("=")
                if key not in options or not value:
                    fail(f"{rel}:{line}: unknown fence attribute '{a}'")
                options[key] = value
            if options["requires"] not in ("none", "mpi", "thrust", "zlib"):
                fail(f"{rel}:{line}: requires= must be mpi, thrust or zlib")
            if not options["np"].isdigit():
                fail(f"{rel}:{line}: np= must be a number")
            name = "doc_" + re.sub(r"[^A-Za-z0-9]", "_", rel.removesuffix(".md")) + f"_{line}"
            header = f"// Extracted from {rel}:{line} by tests/docs/extract_snippets.py.\n"
            if options["fragment"]:
                program = programs / (options["fragment"] + ".cpp")
                if not program.exists():
                    fail(f"{rel}:{line}: fragment program {program} does not exist")
                text = program.read_text(encoding="utf-8")
                if text.count("// @snippet\n") != 1:
                    fail(f"{program}: needs exactly one line '// @snippet'")
                code = text.replace("// @snippet\n", f'#line 1 "{rel}:{line}"\n' + code + "#line 1 \"after-snippet\"\n")
            (out / f"{name}.cpp").write_text(header + code, encoding="utf-8")
            calls.append(f'gradcomp_doc_snippet({name} "{rel}:{line}" {options["requires"]} {options["np"]})')
    (out / "snippets.cmake").write_text("\n".join(calls) + "\n", encoding="utf-8")
    print(f"extract_snippets: {len(calls)} blocks from {len(files)} files")


if __name__ == "__main__":
    main()
