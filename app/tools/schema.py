"""Caller-supplied JSON Schemas (request tools, persona custom tools): checked once, applied safely.

The schemas come from callers and the values they check from model-written code, and both are
checked on the event loop, so applying a schema may neither take more than about linear time nor
reach outside the process:

- every pattern (``pattern``, ``patternProperties``, the ``regex`` format) runs on RE2, which never
  backtracks: Python's ``re`` takes seconds on ``^(a+)+$`` and ``"a" * 26 + "!"``, holding the GIL
  (so a thread would not help); a pattern RE2 cannot run (backreferences, lookaround) is refused
  when the tool is defined;
- ``uniqueItems`` hashes items instead of comparing every pair (quadratic: 2,000 objects took 6 s);
- ``$ref`` resolves within the schema and the JSON Schema meta-schemas, never from a URL or a file
  (jsonschema's default fetches them, blocking, from wherever they point);
- a schema nests at most ``MAX_DEPTH`` levels, and one check evaluates a number of keywords linear in
  the size of what it checks: references can make a 1 KB schema take exponential time (2**n
  evaluations for n chained allOfs);
- a schema holds at most ``MAX_SCHEMA_NODES`` objects and arrays, and the tools of one request
  ``MAX_REQUEST_SCHEMA_NODES`` together: checking a schema against the 2020-12 meta-schema costs
  jsonschema about 0.3 ms for each (its dynamic references), so a 2 MB body of ``{"allOf": [{}, {},
  …]}`` held the event loop for over two minutes.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import re2
import referencing
import referencing.exceptions
from cachetools import LRUCache
from jsonschema import Draft202012Validator, FormatChecker, ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import extend

from app.kit.json_body import MAX_DEPTH, nesting_path

if TYPE_CHECKING:  # the stubs' name for the classes jsonschema creates at run time
    from jsonschema.validators import _Validator

# Keyword evaluations one check may make: a base, plus a few per JSON value of the arguments, so the
# worst case grows linearly with their size like a legitimate check does (which needs 1-3 per value).
# jsonschema takes 10-20 µs a keyword, so a pathological schema stops within about 40 ms (a tool
# schema of a hundred properties needs a few hundred), and stays well under a second on a busy host.
BASE_STEPS: Final = 2_000
STEPS_PER_VALUE: Final = 10
# Objects and arrays (the subschemas, and the lists holding them) of one schema, and of all the tools
# a request declares: about 0.3 s and 0.6 s of meta-schema checking at most (a tool of a hundred
# properties holds about two hundred).
MAX_SCHEMA_NODES: Final = 1_000
MAX_REQUEST_SCHEMA_NODES: Final = 2_000
PATTERN_CACHE_SIZE: Final = 256
# Compiled schemas kept, by the size of their text: 32 MiB in all, none larger than 1 MiB (a larger
# one is compiled again when it comes back; what it costs is bounded by MAX_SCHEMA_NODES).
SCHEMA_CACHE_BYTES: Final = 32 << 20
SCHEMA_CACHE_ENTRY_BYTES: Final = 1 << 20


class SchemaProblem(ValueError):
    """A schema SABRE refuses; the message says what and where (callers prefix the tool's name)."""


class _Regexp(Protocol):
    def search(self, text: str | bytes) -> object | None: ...


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the caller's mistake, reported to them, not logged
_RE2_OPTIONS.max_mem = 1 << 20  # per compiled pattern, so the cache below stays small


class PatternProblem(SchemaProblem):
    """A pattern RE2 cannot run; ``at(where)`` names its place in the schema once that is known."""

    def __init__(self, pattern: str, reason: str, where: str | None = None) -> None:
        self.pattern, self.reason = pattern, reason
        at = f" at {where}" if where else ""
        super().__init__(
            f"pattern {pattern!r}{at} cannot run on RE2 ({reason}): tool schemas use this linear-time "
            "engine, which has no backreferences or lookaround"
        )

    def at(self, where: str) -> PatternProblem:
        return PatternProblem(self.pattern, self.reason, where)


@functools.lru_cache(maxsize=PATTERN_CACHE_SIZE)
def compile_pattern(pattern: str) -> _Regexp:
    """``pattern`` compiled by RE2 (cached); ``PatternProblem`` when RE2 cannot run it."""
    try:
        compiled: _Regexp = re2.compile(pattern, _RE2_OPTIONS)
    except UnicodeEncodeError:
        raise PatternProblem(pattern, "not valid Unicode: a lone surrogate") from None
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise PatternProblem(pattern, str(reason)) from None
    return compiled


def _regexp(pattern: object) -> _Regexp:
    if not isinstance(pattern, str):
        raise SchemaProblem(f"pattern {pattern!r} is not a string")
    return compile_pattern(pattern)


def _search(regexp: _Regexp, text: str) -> bool:
    """Whether ``regexp`` matches somewhere in ``text`` (RE2 reads UTF-8: lone surrogates pass as is)."""
    try:
        return regexp.search(text) is not None
    except UnicodeEncodeError:
        return regexp.search(text.encode("utf-8", "surrogatepass")) is not None


def _short(value: Any) -> str:
    """``repr(value)``, abridged: error messages go back to the model, which needs no megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}…{text[-15:]}"


# -- keywords whose stock implementations use Python's re or are quadratic --------------------------


def _pattern(validator: _Validator, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        regexp = _regexp(pattern)
    except SchemaProblem as exc:
        yield ValidationError(str(exc))
        return
    if not _search(regexp, instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _pattern_properties(
    validator: _Validator, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        try:
            regexp = _regexp(pattern)
        except SchemaProblem as exc:
            yield ValidationError(str(exc))
            continue
        for key, value in instance.items():
            if _search(regexp, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _matched_by_patterns(schema: Mapping[str, Any], key: str) -> bool:
    for pattern in schema.get("patternProperties", {}):
        try:
            if _search(_regexp(pattern), key):
                return True
        except SchemaProblem:
            continue  # reported by patternProperties itself
    return False


def _additional_properties(
    validator: _Validator, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    extras = [k for k in instance if k not in properties and not _matched_by_patterns(schema, k)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        joined = ", ".join(_short(extra) for extra in sorted(extras))
        if "patternProperties" in schema:
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({joined} {verb} unexpected)")


def _identity(value: Any) -> Hashable:
    """A hashable stand-in equal exactly when two JSON values are (1 == 1.0, but True != 1)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _identity(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_identity(v) for v in value))
    return (type(value).__name__, value)


def _unique_items(
    validator: _Validator, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Hashable] = set()
    for item in instance:
        key = _identity(item)
        if key in seen:
            yield ValidationError(f"{_short(instance)} has non-unique elements")
            return
        seen.add(key)


# -- the work budget -----------------------------------------------------------------------------


class TooCostly(Exception):
    """A check ran out of keyword evaluations."""


_steps_left: ContextVar[list[int] | None] = ContextVar("schema_steps_left", default=None)

Keyword = Callable[..., Any]  # (validator, keyword value, instance, schema) -> errors


def _metered(keyword: Keyword) -> Keyword:
    """``keyword``, counting against the running check's budget (unmetered outside ``argument_errors``)."""

    def metered(validator: _Validator, value: Any, instance: Any, schema: Any) -> Any:
        left = _steps_left.get()
        if left is not None:
            left[0] -= 1
            if left[0] < 0:
                raise TooCostly
        return keyword(validator, value, instance, schema)

    return metered


_KEYWORDS: dict[str, Keyword] = {
    **Draft202012Validator.VALIDATORS,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}

# The one validator class for caller schemas: JSON Schema 2020-12 with the keywords above.
SchemaValidator: type[Validator] = extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {name: _metered(keyword) for name, keyword in _KEYWORDS.items()}
)

# References resolve within the schema and to the meta-schemas only: nothing is retrieved.
_LOCAL_ONLY: Final[referencing.Registry[Any]] = referencing.Registry()

# Checking a schema against the meta-schema: the ``regex`` format means "RE2 can run it".
_FORMATS = FormatChecker(Draft202012Validator.FORMAT_CHECKER.checkers)


@_FORMATS.checks("regex", raises=PatternProblem)
def _is_re2_pattern(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


# -- checking a schema ---------------------------------------------------------------------------


def _where(path: list[Any]) -> str:
    """A location in a schema, abridged past a dozen steps."""
    shown = "/".join(str(part) for part in path[:12])
    return (shown + ("/…" if len(path) > 12 else "")) or "(root)"


def compile_schema(schema: Mapping[str, Any]) -> Validator:
    """A validator for ``schema`` once it is checked; ``SchemaProblem`` says what is wrong and where.

    Cached per distinct schema, by the size of its text (``SCHEMA_CACHE_BYTES``): the meta-schema
    check costs milliseconds, and the same tools come back on every turn of a conversation.
    """
    path = nesting_path(schema)
    if path is not None:
        raise SchemaProblem(f"nested deeper than {MAX_DEPTH} levels at {_where(path)}")
    if count_nodes(schema, limit=MAX_SCHEMA_NODES) > MAX_SCHEMA_NODES:
        raise SchemaProblem(f"more than {MAX_SCHEMA_NODES} objects and arrays (subschemas); simplify it")
    schema_json = json.dumps(schema, sort_keys=True, default=str)
    with _COMPILED_LOCK:
        cached = _COMPILED.get(schema_json)
    if cached is not None:
        return cached.validator
    validator = _compile(schema_json)
    if len(schema_json) <= SCHEMA_CACHE_ENTRY_BYTES:
        with _COMPILED_LOCK:
            _COMPILED[schema_json] = _Compiled(len(schema_json), validator)
    return validator


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A cached validator and the size of the schema text it was compiled from."""

    size: int
    validator: Validator


# Keyed by the schema's text and bounded by the bytes of those texts (a count of entries is no bound:
# a schema may be as large as a request body), least recently used first out.
_COMPILED: LRUCache[str, _Compiled] = LRUCache(maxsize=SCHEMA_CACHE_BYTES, getsizeof=lambda entry: entry.size)
_COMPILED_LOCK = threading.Lock()


def _compile(schema_json: str) -> Validator:
    schema = json.loads(schema_json)
    _check_keywords(schema)
    try:
        Draft202012Validator.check_schema(schema, format_checker=_FORMATS)
    except SchemaError as exc:
        where = _where(list(exc.absolute_path))
        if isinstance(exc.cause, PatternProblem):
            raise exc.cause.at(where) from None
        raise SchemaProblem(f"not a valid JSON Schema at {where}: {exc.message}") from None
    except RecursionError:
        raise SchemaProblem(f"nested too deeply to check (more than {MAX_DEPTH} levels)") from None
    # Without ``$schema`` every subschema, even one reached through ``$ref: "#"``, stays with this
    # class: jsonschema picks the validator class of a subschema from its ``$schema``.
    root = {key: value for key, value in schema.items() if key != "$schema"}
    return SchemaValidator(root, registry=_LOCAL_ONLY)


def _check_keywords(schema: dict[str, Any]) -> None:
    """Refuse what would let a subschema escape ``SchemaValidator``: a nested ``$schema`` (it would
    switch to jsonschema's own class and its ``re``), and ``unevaluatedProperties`` together with
    ``patternProperties`` (jsonschema then matches the patterns with ``re`` internally)."""
    first: dict[str, list[Any]] = {}
    stack: list[tuple[Any, list[Any]]] = [(schema, [])]
    while stack:  # the depth is already bounded, but a loop is as short as recursion
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            if isinstance(node, dict) and key in ("$schema", "unevaluatedProperties", "patternProperties"):
                first.setdefault(key, [*path, key])
                if key == "$schema" and path:
                    raise SchemaProblem(
                        f"'$schema' is allowed only at the top of the schema (found at {_where(path)})"
                    )
            stack.append((child, [*path, key]))
    if "unevaluatedProperties" in first and "patternProperties" in first:
        raise SchemaProblem(
            "unevaluatedProperties cannot be combined with patternProperties "
            f"(at {_where(first['unevaluatedProperties'])} and {_where(first['patternProperties'])})"
        )


def count_nodes(schema: Any, *, limit: int) -> int:
    """How many objects and arrays ``schema`` holds, itself included, counted up to ``limit + 1``
    (iterative, stopping there: cheap for any size)."""
    count, stack = 0, [schema]
    while stack and count <= limit:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
        else:
            continue
        count += 1
    return count


INLINE_SCHEMA_NODES: Final = 200
"""Schemas of up to this many objects and arrays together are checked where they come (tens of
milliseconds at most); larger ones in the checking thread (``off_loop``)."""

_CHECKS: Final = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sabre-schema-check")
_T = TypeVar("_T")


async def off_loop(call: Callable[[], _T]) -> _T:
    """Run ``call`` (schema checks) in the one thread kept for them. Checking a schema against the
    meta-schema costs jsonschema ~0.3 ms a subschema, up to ~0.6 s for a request's tools: on the
    event loop that would stall every tenant's requests meanwhile, while from a thread the loop
    runs between the interpreter's switches. A thread of their own, so that they queue behind each
    other, not in front of the default executor's work (DNS lookups, page parsing)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_CHECKS, context.run, call)


def check_request_size(schemas: Iterable[Mapping[str, Any] | None]) -> int:
    """How many objects and arrays the tools of one request hold together; ``SchemaProblem`` past
    ``MAX_REQUEST_SCHEMA_NODES`` (each is checked against the meta-schema, at a cost per subschema)."""
    total = 0
    for schema in schemas:
        total += count_nodes(schema, limit=MAX_REQUEST_SCHEMA_NODES - total)
        if total > MAX_REQUEST_SCHEMA_NODES:
            raise SchemaProblem(
                f"the tools' parameters hold more than {MAX_REQUEST_SCHEMA_NODES} objects and arrays "
                "(subschemas) together; declare fewer tools or simpler ones"
            )
    return total


def _count_values(instance: Any) -> int:
    """How many JSON values ``instance`` holds, itself included (iterative: any depth is safe)."""
    count, stack = 0, [instance]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return count


def argument_errors(validator: Validator, instance: Any, *, limit: int = 5) -> list[str]:
    """Up to ``limit`` messages (each with where) on how ``instance`` breaks the schema; [] if it fits.

    Metered: past ``BASE_STEPS + STEPS_PER_VALUE * values`` keyword evaluations the check stops and
    says so, instead of holding the event loop.
    """
    steps = BASE_STEPS + STEPS_PER_VALUE * _count_values(instance)
    token = _steps_left.set([steps])
    try:
        errors = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.path])
    except TooCostly:
        return [f"checking them against the tool's schema takes more than {steps} steps (too costly)"]
    except RecursionError:
        return ["nested too deeply to check against the tool's schema"]
    except referencing.exceptions.Unresolvable as exc:
        return [f"the tool's schema cannot be applied: unresolvable reference {exc}"]
    finally:
        _steps_left.reset(token)
    described = []
    for error in errors[:limit]:
        where = ".".join(str(p) for p in error.path)
        described.append(f"{where}: {error.message}" if where else error.message)
    return described
