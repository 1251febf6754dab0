"""MkDocs hooks for the docs site (mkdocs.yml loads them). The guides live where a reader of
the repository finds them (README.md at the top, the examples' READMEs beside their code), so
the site publishes those files as pages (README.md as the home page, examples/<name>/README.md
as examples/<name>.md, CHANGELOG.md as changelog.md) and rewrites the guides' relative links to
them into links between pages. A link to anything else outside docs/ is left alone, so that
`mkdocs build --strict` fails on it as on any broken link."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def published() -> dict[str, str]:
    """Repository path -> site page path, for each file outside docs/ the site publishes."""
    pages = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
    for readme in sorted(ROOT.glob("examples/*/README.md")):
        pages[readme.relative_to(ROOT).as_posix()] = f"examples/{readme.parent.name}.md"
    return pages


def _repo_path(page: str) -> str:
    """Where the page's source sits in the repository."""
    for repo, site in published().items():
        if site == page:
            return repo
    return f"docs/{page}"


def rewrite_links(markdown: str, page: str) -> str:
    """``markdown`` of the site page ``page`` with each relative link to a published file
    pointing at its page."""
    here = posixpath.dirname(_repo_path(page))
    site_dir = posixpath.dirname(page)
    pages = published()

    def one(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        repo = posixpath.normpath(posixpath.join(here, target))
        if repo.startswith("docs/"):
            site = repo[len("docs/"):]
        elif repo in pages:
            site = pages[repo]
        else:
            return m.group(0)
        rel = posixpath.relpath(site, site_dir or ".")
        return f"{m.group(1)}{rel}{m.group(3) or ''}{m.group(4)}"

    return _LINK.sub(one, markdown)


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    for repo, site in published().items():
        source = ROOT / repo
        if source.exists():
            files.append(File.generated(config, site, content=source.read_text()))
    return files


def on_page_markdown(markdown: str, page: Page, **kwargs: Any) -> str:
    return rewrite_links(markdown, page.file.src_uri)
