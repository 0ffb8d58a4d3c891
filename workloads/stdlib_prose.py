"""Stdlib prose and code: drafter-training prompts from the Python standard library.

Three kinds of prompt, all built from text that ships with the interpreter (nothing
is downloaded):

- ``doc``: a module docstring (``inspect.getdoc``) from ``STDLIB_MODULES``, asked as
  "Explain this documentation: ...";
- ``topic``: an entry of ``pydoc_data.topics.topics`` (the language reference pages
  behind ``help('for')``; keywords that share a page, like ``if``/``else``, appear once),
  asked the same way;
- ``code``: the opening lines of a pure-Python function or method defined in one of
  those modules (``inspect.getsource``; an alias counts once, under the alphabetically
  first name), asked as "Continue this code: ...".

Use: drafter TRAINING only (``split="train"``; the registry default). The text varies
with the Python version, so it is not a stable benchmark; the ``eval`` split (the same
id-hash rule as every source) exists to measure held-out loss during training, not
to benchmark decoding speed.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap

from .base import Prompt, Workload, WorkloadError

# Modules present in CPython 3.10 through 3.13 whose import has no side effects.
STDLIB_MODULES = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "codecs", "collections", "colorsys",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "doctest",
    "email.message", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext",
    "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http.client",
    "http.cookies", "inspect", "ipaddress", "json", "json.decoder", "locale", "logging", "logging.handlers",
    "mimetypes", "numbers", "operator", "optparse", "pathlib", "pickle", "pkgutil", "platform", "plistlib",
    "posixpath", "pprint", "queue", "quopri", "random", "re", "sched", "secrets", "selectors", "shlex",
    "shutil", "smtplib", "socketserver", "statistics", "string", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "types", "typing", "unittest",
    "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "zipfile",
)
MAX_CODE_OBJECTS_PER_MODULE = 6
MIN_CODE_LINES = 8
MAX_SHOWN_CODE_LINES = 40
MAX_DOC_CHARS = 2000
EXPLAIN_TEMPLATE = "Explain this documentation:\n\n{text}"
CONTINUE_TEMPLATE = "Continue this code:\n```python\n{code}"


def _clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, cut at the last paragraph (else line) break before it."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = head.rfind("\n\n")
    if cut < limit // 2:
        cut = head.rfind("\n")
    return head[:cut].rstrip() if cut > 0 else head


def public_objects(module, classes: bool) -> list[tuple[str, object]]:
    """(name, object) of the module's own public top-level functions (``name``) and public methods of its public
    classes (``Class.method``), in name order; with ``classes`` the classes themselves too (before their methods).
    One object may appear under two names (aliases)."""
    candidates: list[tuple[str, object]] = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            candidates.append((name, obj))
        elif inspect.isclass(obj):
            if classes:
                candidates.append((name, obj))
            candidates.extend((f"{name}.{attr}", member) for attr, member in sorted(vars(obj).items())
                              if not attr.startswith("_") and inspect.isfunction(member))
    return candidates


def _code_objects(module) -> list[tuple[str, str]]:
    """(qualified name, source) of the module's own pure-Python functions and methods.

    Functions only (``inspect.getsource`` of a function reads from its code object's
    first line; for a class it would re-parse the whole module, far too slow here).
    Public top-level functions come as ``name``, public methods of public classes as
    ``Class.method``; aliases (one object under two names) count once.
    """
    candidates = public_objects(module, classes=False)
    found = []
    seen: set[int] = set()
    for name, func in candidates:
        if id(func) in seen:
            continue
        seen.add(id(func))
        try:
            source = inspect.getsource(func)
        except (OSError, TypeError):  # no source file: not a code sample
            continue
        if len(source.splitlines()) >= MIN_CODE_LINES:
            found.append((name, textwrap.dedent(source)))
    return found


class StdlibProseWorkload(Workload):
    """Documentation and code continuation prompts from the standard library (training use)."""

    NAME = "stdlib_prose"

    def load_pool(self) -> list[Prompt]:
        if self.spec.path is not None:
            raise WorkloadError(f"workload.path: stdlib_prose reads the installed standard library and takes no "
                                f"path (got {self.spec.path!r})")
        pool: list[Prompt] = []
        for module_name in STDLIB_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise WorkloadError(f"stdlib_prose: cannot import standard-library module {module_name!r} ({exc}); "
                                    "remove it from STDLIB_MODULES for this Python build") from exc
            doc = inspect.getdoc(module)
            if doc and doc.strip():
                pool.append(self._user(f"stdlib/doc/{module_name}", EXPLAIN_TEMPLATE.format(
                    text=_clip(doc, MAX_DOC_CHARS)), "stdlib:doc"))
            for name, source in _code_objects(module)[:MAX_CODE_OBJECTS_PER_MODULE]:
                lines = source.splitlines(keepends=True)
                shown = lines[:min(MAX_SHOWN_CODE_LINES, max(3, len(lines) * 2 // 5))]
                pool.append(self._user(f"stdlib/code/{module_name}.{name}",
                                       CONTINUE_TEMPLATE.format(code="".join(shown)), "stdlib:code"))
        from pydoc_data.topics import topics

        seen_topic_texts: set[str] = set()
        for topic in sorted(topics):
            text = topics[topic]
            if text.strip() and text not in seen_topic_texts:  # several keywords share one page ('if', 'else')
                seen_topic_texts.add(text)
                pool.append(self._user(f"stdlib/topic/{topic}", EXPLAIN_TEMPLATE.format(
                    text=_clip(text, MAX_DOC_CHARS)), "stdlib:topic"))
        return pool

    @staticmethod
    def _user(prompt_id: str, content: str, source: str) -> Prompt:
        return Prompt(id=prompt_id, messages=[{"role": "user", "content": content}], prompt=None, max_tokens=None,
                      source=source)


__all__ = ["STDLIB_MODULES", "StdlibProseWorkload"]
