"""Reading YAML/JSON spec and config files with bounded cost.

``yaml.safe_load`` is safe from code execution, not from size: ten lines of nested aliases
(``b: [*a, *a, ...]``) describe a billion nodes, which everything downstream (validation, error messages,
``json.dumps``) then walks one by one. So a spec or config file is refused when

- the file is larger than `MAX_FILE_BYTES` (a spec is a few kilobytes),
- the document uses more than `MAX_ALIASES` aliases, or
- the document, with every alias expanded, has more than `MAX_NODES` nodes (or refers to itself).

The node count is taken on the composed graph, where an alias is a shared reference, before any Python
object is built: the check costs as much as the file is long, never as much as it expands to.

Two departures from PyYAML's defaults, so that what a file says is what zoo reads: a key given twice in one
mapping is an error naming the key and its lines (PyYAML keeps the last value silently; YAML forbids it),
and ``1e-5`` is a float as in YAML 1.2 (PyYAML reads it as a string).

This module imports no torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 10 * 2**20
MAX_ALIASES = 100
MAX_NODES = 100_000


class YAMLLimitError(yaml.YAMLError):
    """A document over the size limits (raised before its data is built)."""


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice (YAML itself forbids it; PyYAML keeps the last silently)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases as they are read and expanded nodes once a document is composed,
    refuses a key given twice in one mapping, and reads ``1e-5`` as a float."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) may override keys; a non-scalar key is PyYAML's to refuse
            key, line = self.construct_object(key_node, deep=False), key_node.start_mark.line + 1
            if key in first_line:
                where = (
                    f"on line {line}" if line == first_line[key] else f"on lines {first_line[key]} and {line}"
                )
                raise DuplicateKeyError(
                    f"the key {_short(key)} is given twice in one mapping ({where}); give it once"
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YAMLLimitError(f"more than {MAX_ALIASES} aliases (*name); write the values out")
        return super().compose_node(parent, index)

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _check_expanded_size(node)
        return node


def _short(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:45]}... ({len(text):,} chars)"


# YAML 1.2 reads 1e-5 and 1.0e5 as floats; PyYAML (YAML 1.1) needs a dot and a signed exponent, and reads
# them as strings. A float field is strict (`zoo.spec.blocks.Spec`), so the loader reads them as floats.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _check_expanded_size(root: yaml.Node) -> None:
    """Raise unless ``root`` with its aliases expanded has at most `MAX_NODES` nodes and no cycle."""
    sizes: dict[int, int] = {}  # id(node) -> expanded size, each shared node counted once per use
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise YAMLLimitError("an alias refers to a node that contains it (a recursive document)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise YAMLLimitError(
                    f"more than {MAX_NODES:,} values once aliases are expanded; a spec or config is far smaller"
                )
        active.discard(key)
        sizes[key] = total
        return total

    size(root)


def load_yaml(text: str) -> Any:
    """Parse one YAML (or JSON) document within the limits; raises `yaml.YAMLError` (`YAMLLimitError`)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:  # nesting deeper than Python's stack: far past any real spec
        raise YAMLLimitError("nested too deeply") from None
    except ValueError as error:  # e.g. an int of more than 4300 digits (Python's str->int limit)
        raise YAMLLimitError(str(error)) from None
    finally:
        loader.dispose()


def read_yaml_file(path: Path, *, what: str = "file") -> Any:
    """The parsed contents of a YAML/JSON file of at most `MAX_FILE_BYTES`.

    Raises OSError (unreadable), `YAMLLimitError` (too large), `yaml.YAMLError` or UnicodeDecodeError.
    """
    with path.open("rb") as file:
        raw = file.read(MAX_FILE_BYTES + 1)  # read at most the limit: a pipe or a growing file cannot hang us
    if len(raw) > MAX_FILE_BYTES:
        raise YAMLLimitError(f"larger than {MAX_FILE_BYTES // 2**20} MiB; a {what} is a few kilobytes")
    return load_yaml(raw.decode("utf-8"))
