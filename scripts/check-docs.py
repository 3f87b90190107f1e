#!/usr/bin/python3
r"""Check that the documentation's references are true (ctest: docs_references).

    /usr/bin/python3 scripts/check-docs.py [ROOT]

ROOT defaults to the repository holding this script. Standard library only.
Prints one line per problem (`file:line: what`) and exits 1, or exits 0 when
every check passes. Three checks:

(a) Section references. Every `docs/<path>.md, "<title>"` (or one of the
    forms `docs/<path>.md ("<title>"` and `docs/<path>.md "<title>"`) in
    README.md, docs/ (all text files, so the copies of the cell files under
    docs/data/ too), scripts/, src/, tools/, python/, examples/ and tests/
    must name an existing file one of whose headings matches the title.
    - A file `docs/<name>.md` beside a folder `docs/<name>/` is that
      folder's index: a title cited against it also matches the headings of
      the pages `docs/<name>/*.md` (docs/benchmarks.md and its pages).
    - A quoted title may run over lines: the line break, the indentation
      and, outside markdown, a comment marker (`//`, `#`, `*`, `--`) at the
      start of the next line read as one space. In C and C++ a string
      literal continued on the next line (`"...\"Two "` then `"hosts\")"`)
      is joined, and `\"` reads as a quote everywhere but in markdown.
    - Only the first title after the file is checked, and any further
      titles chained with commas (`docs/<path>.md, "X", "Y"`).
    - Headings: a markdown heading of any level outside fenced code, or a
      paragraph or list item that opens with bold text (`**The long
      schedule** (3,000 steps ...`), the run-in headings the pages use below
      their subsections.
    - A title matches a heading when, with backticks and asterisks removed
      and white space collapsed, it equals the heading or is a prefix of it
      that ends at a word boundary ("Muon" matches "Muon: orthogonalized
      updates ...", not "Muonic"). Case matters.
    - A title quoted without a file (`"Muon" below`) is not checked: it
      names a section of the page it is in.

(b) Paths in docs/architecture.md. Every word written in backticks, and every
    word in a table cell, that starts with src/, tools/, tests/, scripts/,
    python/, docs/, examples/, cmake/ or .ci/ must exist in the tree.
    Readings: only the first word of a backtick span counts (a command's
    arguments follow it); trailing punctuation is dropped; `{a,b}` expands
    to every alternative, each of which must exist; `name.sh/.py` means
    both `name.sh` and `name.py`; `*` is a glob and `...` stands for any
    number of folders (`**`), each of which must match something; a
    placeholder `<name>` (or markdown's `\<name\>`) is a glob `*`; a path
    without an extension also passes when a file of that stem exists
    (`tests/sync/sync_fingerprint` is the binary of
    `tests/sync/sync_fingerprint.cc`, `tools/sparsecomm/cli_util` the pair
    `cli_util.h`/`.cc`).

(c) Relative links. Every inline link `[text](target)` and reference-style
    definition `[label]: target` in README.md and docs/**/*.md whose target
    has no URL scheme must resolve from the linking file's folder to an
    existing file or folder; a `#fragment` is dropped and not checked, and a
    target of only a fragment is skipped. Links inside fenced code blocks and
    inline code are not links.
"""

import glob
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SOURCE_TREES = ["scripts", "src", "tools", "python", "examples", "tests"]
SKIP_DIRS = {".git", "build", "__pycache__", "node_modules"}
PATH_PREFIXES = ("src/", "tools/", "tests/", "scripts/", "python/", "docs/", "examples/",
                 "cmake/", ".ci/")

problems = []


def problem(path, line, text):
    problems.append("%s:%d: %s" % (os.path.relpath(path, ROOT), line, text))


def read_text(path):
    """The file's text, or None for a binary or undecodable file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def walk_files(top):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            yield os.path.join(dirpath, name)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def fenced_mask(lines):
    """For each line: True inside a fenced code block (fences included)."""
    mask, fence = [], None
    for line in lines:
        stripped = line.lstrip()
        marker = stripped[:3]
        if fence is None and marker in ("```", "~~~"):
            fence = marker
            mask.append(True)
        elif fence is not None and stripped.startswith(fence):
            fence = None
            mask.append(True)
        else:
            mask.append(fence is not None)
    return mask


def normalize(title):
    title = title.replace("`", "").replace("*", "")
    return " ".join(title.split())


HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
BOLD_LEAD = re.compile(r"^\s*(?:[-+*]\s+|\d+\.\s+)?\*\*(.+?)\*\*")

_headings = {}


def headings_of(path):
    """The normalized headings and bold leads of a markdown file."""
    if path not in _headings:
        text = read_text(path) or ""
        lines = text.split("\n")
        found = []
        for line, fenced in zip(lines, fenced_mask(lines)):
            if fenced:
                continue
            m = HEADING.match(line)
            if m:
                found.append(normalize(m.group(2)))
                continue
            m = BOLD_LEAD.match(line)
            if m:
                found.append(normalize(m.group(1)))
        _headings[path] = found
    return _headings[path]


def title_matches(title, heading):
    if heading == title:
        return True
    return (heading.startswith(title) and
            not (heading[len(title)].isalnum() and title[-1:].isalnum()))


# (a) ------------------------------------------------------------------------

REFERENCE = re.compile(r'(docs/[A-Za-z0-9_./-]+\.md)(?:\s*,\s*|\s*\(\s*|[ \t]+)"([^"]{1,300}?)"')
CHAINED = re.compile(r'\s*,\s*"([^"]{1,300}?)"')
CONTINUATION = re.compile(r"\s*\n\s*(?:(?://+|#+|\*+|--)\s*)?")


def prepare(path, text):
    """Text in which quoted titles read as they would in markdown."""
    if path.endswith(".md"):
        return text
    if os.path.splitext(path)[1] in (".cc", ".h", ".cpp", ".hpp", ".c", ".cu"):
        # A string literal continued on the next line: "... \"Two " "hosts\")".
        # Replaced by as many newlines so that line numbers stay right.
        text = re.sub(r'"[ \t]*\n[ \t]*"', lambda m: "\n" * m.group(0).count("\n"), text)
        # Joining left "Two \nhosts": fine, a newline reads as a space below.
    return text.replace('\\"', '"')


def pages_of(path):
    """The file itself and, for the index of a folder of the same name, its pages."""
    folder = os.path.splitext(path)[0]
    if os.path.isdir(folder):
        return [path] + sorted(glob.glob(os.path.join(glob.escape(folder), "*.md")))
    return [path]


def check_title(path, text, offset, target, title, is_markdown):
    if is_markdown:
        title = " ".join(title.split())
    else:
        title = " ".join(CONTINUATION.sub(" ", title).split())
    title = normalize(title)
    line = line_of(text, offset)
    full = os.path.join(ROOT, target)
    if not os.path.isfile(full):
        problem(path, line, 'reference to %s, "%s": no such file' % (target, title))
        return
    if not any(title_matches(title, h) for page in pages_of(full) for h in headings_of(page)):
        problem(path, line, 'reference to %s, "%s": no heading of that file starts so'
                % (target, title))


def check_references(path):
    text = read_text(path)
    if text is None or "docs/" not in text:
        return
    text = prepare(path, text)
    is_markdown = path.endswith(".md")
    for m in REFERENCE.finditer(text):
        check_title(path, text, m.start(), m.group(1), m.group(2), is_markdown)
        end = m.end()
        while True:
            c = CHAINED.match(text, end)
            if not c:
                break
            check_title(path, text, c.start(1), m.group(1), c.group(1), is_markdown)
            end = c.end()


def reference_files():
    files = [os.path.join(ROOT, "README.md")]
    files += walk_files(os.path.join(ROOT, "docs"))
    for tree in SOURCE_TREES:
        files += walk_files(os.path.join(ROOT, tree))
    return [f for f in files if os.path.isfile(f)]


# (b) ------------------------------------------------------------------------

PATH_WORD = re.compile(r"(?<![\w./-])((?:src|tools|tests|scripts|python|docs|examples|cmake|\.ci)"
                       r"/[^\s`|;,()\[\]\"']*)")


def expand_braces(word):
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        return [word]
    out = []
    for alternative in m.group(1).split(","):
        out += expand_braces(word[:m.start()] + alternative + word[m.end():])
    return out


def path_exists(word):
    if "*" in word or "..." in word:
        pattern = word.replace("...", "**")
        return bool(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    full = os.path.join(ROOT, word)
    if os.path.exists(full):
        return True
    base = os.path.basename(word.rstrip("/"))
    if word.endswith("/") or "." in base:
        return False
    return bool(glob.glob(glob.escape(full) + ".*"))


def check_path_word(path, line, word):
    word = word.replace("\\<", "<").replace("\\>", ">")
    word = re.sub(r"<[^<>/]*>", "*", word)
    word = word.rstrip(".:,;")
    if not word.startswith(PATH_PREFIXES):
        return
    candidates = []
    for w in expand_braces(word):
        m = re.match(r"^(.*?)(\.\w+)((?:/\.\w+)+)$", w)
        if m:
            candidates.append(m.group(1) + m.group(2))
            candidates += [m.group(1) + ext for ext in m.group(3).split("/")[1:]]
        else:
            candidates.append(w)
    for c in candidates:
        if not path_exists(c):
            problem(path, line, "path %s: not in the tree" % c)


def check_architecture():
    path = os.path.join(ROOT, "docs", "architecture.md")
    text = read_text(path)
    if text is None:
        problem(path, 0, "missing")
        return
    lines = text.split("\n")
    for number, (line, fenced) in enumerate(zip(lines, fenced_mask(lines)), 1):
        if fenced:
            continue
        seen = set()
        for span in re.findall(r"`([^`]+)`", line):
            words = span.split()
            if words and words[0] not in seen:
                seen.add(words[0])
                check_path_word(path, number, words[0])
        if line.lstrip().startswith("|"):
            bare = re.sub(r"`[^`]*`", " ", line)
            for word in PATH_WORD.findall(bare):
                if word not in seen:
                    seen.add(word)
                    check_path_word(path, number, word)


# (c) ------------------------------------------------------------------------

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def check_links(path):
    text = read_text(path)
    if text is None:
        return
    lines = text.split("\n")
    folder = os.path.dirname(path)
    for number, (line, fenced) in enumerate(zip(lines, fenced_mask(lines)), 1):
        if fenced:
            continue
        bare = re.sub(r"`[^`]*`", "", line)
        targets = INLINE_LINK.findall(bare)
        m = DEFINITION.match(bare)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if SCHEME.match(target) or target.startswith("#"):
                continue
            target_path = target.split("#", 1)[0]
            if not os.path.exists(os.path.normpath(os.path.join(folder, target_path))):
                problem(path, number, "link %s: does not resolve" % target)


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    files += [f for f in walk_files(os.path.join(ROOT, "docs")) if f.endswith(".md")]
    return [f for f in files if os.path.isfile(f)]


def main():
    for path in reference_files():
        check_references(path)
    check_architecture()
    for path in markdown_files():
        check_links(path)
    for p in problems:
        print(p)
    if problems:
        print("check-docs: %d problem(s)" % len(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
