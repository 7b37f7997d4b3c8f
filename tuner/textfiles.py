"""Reading a user's file (shapes CSV, search-space YAML, table or expand YAML, a recording,
$TUNE_CONFIG) into one error line naming the file, the line and what was wrong, whatever the
file holds.

Every such file is read through `read_user_file`, which takes regular files only (a FIFO would
block forever, /dev/zero never ends) and at most a size cap per kind of file, and every YAML
document through `parsed_yaml`, whose loader refuses aliases that would expand the document
past a bound (a "billion laughs" file) before anything walks it. Values a message quotes are
cut short by `quoted`: a file may hold anything.
"""
from __future__ import annotations

import os
import stat

import yaml
from yaml.composer import Composer

MiB = 1 << 20
# The most nodes aliases (`*name`) may add to a YAML document beyond those written out: a
# hand-written file reusing a list or two adds a few hundred; a "billion laughs" file, 10**9.
MAX_ALIAS_NODES = 100_000
# The most characters of a value a message quotes.
QUOTED_CHARS = 60


def clipped(text: str, limit: int = QUOTED_CHARS) -> str:
    """Text for a one-line message: on one line, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """A value for a one-line message: its repr, cut to `limit` characters."""
    return clipped(repr(value), limit)


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words ("a FIFO (named pipe)")."""
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "an unknown kind of file"


def _size(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit % MiB == 0 else f"{limit} bytes"


def read_user_file(path: str | os.PathLike, what: str, limit: int, error: type[Exception],
                   label: str | None = None) -> bytes:
    """The bytes of the regular file at `path` (a `what`, e.g. "shapes file"), at most
    `limit` of them.

    OSError (for the caller to word) where it cannot be opened; `error`, starting with
    `label` (default: the path), where it is not a regular file or holds more than `limit`
    bytes. The file is opened without blocking and checked again once open, so a FIFO
    swapped in after the check cannot hang the read; and the cap is what is read, not what
    the file's size claims.
    """
    label = str(path) if label is None else label
    if not stat.S_ISREG(mode := os.stat(path).st_mode):
        raise error(f"{label}: cannot read {what}: it is {file_kind(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
            raise error(f"{label}: cannot read {what}: it is {file_kind(mode)}, not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{label}: cannot read {what}: larger than {_size(limit)}, the most a "
                    f"{what} may hold")
    return data


def decoded(data: bytes, label: str, error: type[Exception]) -> str:
    """`data` as UTF-8 text (a byte-order mark, as Excel's "CSV UTF-8" writes, is fine); else
    `error` naming `label`, the line and the byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{label}:{line}: expected UTF-8 text, got byte "
                    f"0x{data[e.start]:02x}") from None


if yaml.__with_libyaml__:
    class _SafeParsing(Composer, yaml.CSafeLoader):
        """yaml.safe_load's loader reading events with libyaml's parser (a few times faster
        than PyYAML's own, which takes over a second on a table of some hundred entries) but
        composing them with PyYAML's composer: libyaml's recurses in C, so a document nested
        some 100,000 deep would overflow the stack (a crash, not an error), where PyYAML's
        stops at Python's recursion limit; and a composed graph is what BoundedLoader checks."""

        def __init__(self, stream):
            yaml.CSafeLoader.__init__(self, stream)
            Composer.__init__(self)
else:  # a PyYAML built without libyaml
    _SafeParsing = yaml.SafeLoader


class BoundedLoader(_SafeParsing):
    """yaml.safe_load's loader, refusing a document whose aliases would expand it by more
    than MAX_ALIAS_NODES nodes, or refer to a node inside itself, once the node graph is
    composed and before any Python object is built from it. The graph itself is as large as
    the text (an alias is one shared node), so composing is bounded by the file's size cap;
    what is unbounded is whatever walks the built document."""

    def get_single_node(self):
        # The composer files the document's anchors here, and swaps in a new dict after it.
        anchors = self.anchors
        node = super().get_single_node()
        if node is not None and anchors:  # no anchor, no alias: the graph is the text's size
            _check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """ComposerError where the tree `root` stands for holds more than its distinct nodes
    plus MAX_ALIAS_NODES, or is recursive. One pass over the distinct nodes, iterative (a deep
    document must not overflow the stack here): a node entered and not yet summed is an
    ancestor of the one walked, so meeting it again is a cycle."""
    sizes: dict[int, int] = {}  # per node id: its expanded size; 0 while being walked
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, walked = stack.pop()
        if walked:
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
            continue
        if id(node) in sizes:
            continue
        sizes[id(node)] = 0
        stack.append((node, True))
        for child in _children(node):
            if sizes.get(id(child)) == 0:
                raise yaml.composer.ComposerError(
                    None, None, "an alias refers to a node inside itself",
                    child.start_mark)
            stack.append((child, False))
    if sizes[id(root)] > len(sizes) + MAX_ALIAS_NODES:
        raise yaml.composer.ComposerError(
            None, None, f"aliases expand the document past {MAX_ALIAS_NODES} more nodes than "
            "it writes out", root.start_mark)


def parsed_yaml(text: str, label: str, error: type[Exception],
                loader: type[BoundedLoader] = BoundedLoader) -> object:
    """The YAML document of `text`; else `error` naming `label` and the line."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader, or a subclass
    except RecursionError:
        raise error(f"{label}: not valid YAML (nested too deeply)") from None
    except yaml.YAMLError as e:
        raise error(f"{label}{_where(e, text)}: not valid YAML ({_problem(e)})") from None
    except ValueError as e:  # a scalar its constructor refuses: 5000 digits, month 13
        raise error(f"{label}: not valid YAML ({clipped(str(e), 2 * QUOTED_CHARS)})") from None


def _where(e: yaml.YAMLError, text: str) -> str:
    """':LINE' of a YAML error, where it says."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is not None:
        return f":{mark.line + 1}"
    position = getattr(e, "position", None)  # a ReaderError: a character YAML refuses
    return f":{text.count(chr(10), 0, position) + 1}" if isinstance(position, int) else ""


def _problem(e: yaml.YAMLError) -> str:
    """A YAML error's problem on one line, cut short (it may quote the file)."""
    problem = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e)
    return clipped(problem, 2 * QUOTED_CHARS)
