"""The docs say only what is true, checked where a machine can check it:

* every environment variable declared in tensorplay/compiler/config.py (the one module that reads
  them) is in the README's table of switches (the one list of them), and every variable of that
  table is declared there;
* README and docs/ link only inside the repository (the chapter is cited by name and section; the
  one address allowed is the PyTorch CPU wheel index of the set-up instructions), and every relative
  link of docs/ and the README points to a file that exists;
* no page refers to internal planning documents (issue numbers, SPEC sections).
"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ALLOWED_URLS = ("https://download.pytorch.org/whl/cpu",)


def _readme_table():
    text = (REPO / "README.md").read_text()
    table = text.split("## Debugging switches", 1)[1].split("\n\n", 2)[1]
    return set(re.findall(r"`(TP_[A-Z0-9_]+)", table))


def test_every_env_var_is_documented_once():
    from tensorplay.compiler import config
    read, table = set(config.env_vars()), _readme_table()
    assert read - table == set(), f"declared in config.py but not in the README's table: {sorted(read - table)}"
    assert table - read == set(), f"in the README's table but declared nowhere: {sorted(table - read)}"


def test_links_stay_inside_the_repository():
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)    # code blocks and spans are
        text = re.sub(r"`[^`\n]*`", "", text)                              # not links
        for url in re.findall(r"https?://[^\s)`>\]]+", text):
            assert url.rstrip(".,") in ALLOWED_URLS, f"{page.relative_to(REPO)}: link outside the repository: {url}"
        assert "../shared" not in text and "seeds/" not in text, f"{page.relative_to(REPO)} points at unshipped files"
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: broken link {target}"


def test_no_internal_references():
    bad = re.compile(r"\bSPEC\b|\bissue \d+|\(issue \d|helper_brief")
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not bad.search(line), f"{page.relative_to(REPO)}:{n}: {line.strip()}"
