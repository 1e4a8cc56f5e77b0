"""The network policy every fetching helper goes through: no SSRF, bounded size and time.

Model-written code chooses the URLs, so a fetch is a request made by an untrusted party with the
server's network position. Every connection, redirects included, is checked on the address it
actually connects to: the host is resolved here, each address is checked, and the request goes to
that checked address (the ``Host`` header and TLS SNI keep the name), so a DNS answer that changes
between the check and the connection (rebinding) cannot reach anything the check refused.

The rules, in order (``deny`` wins):
1. a host matching a ``deny`` entry (name, ``*.domain``, ``*``, IP or CIDR) is refused;
2. private, loopback, link-local, multicast, reserved and other non-global addresses are refused
   unless an ``allow`` entry that is an IP address or CIDR range contains the address: a host name
   or ``*`` never opens the service's own network;
3. with a non-empty ``allow`` list, the host must match one of its entries;
4. otherwise (no policy, or an empty ``allow``) any public host may be fetched.
Only ``http`` and ``https``; no proxies from the environment (they would hide the real address).
Bodies are decoded here (``gzip`` or ``deflate``, one layer) and never past the size cap: httpx's own
decoders inflate a whole received chunk at once, so 800 bytes of ``Content-Encoding: gzip, gzip``
became 400 MB in the server's memory before any cap was checked (``zstd``, 12 KB).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import TYPE_CHECKING, Final

import httpx

from app.helpers import threads as helper_threads
from app.helpers.base import HelperError

if TYPE_CHECKING:
    from app.config import Settings
    from app.personas.models import Network

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

USER_AGENT: Final = "Mozilla/5.0 (compatible; SABRE helpers; +fetch on behalf of an AI agent)"
SCHEMES: Final = frozenset({"http", "https"})
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
# Content codings a fetch asks for and decodes (bounded: ``BoundedDecoder``), with their zlib window bits.
ACCEPT_ENCODING: Final = "gzip, deflate"
_ZLIB_WBITS: Final = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class FetchError(HelperError):
    """A fetch that failed (bad URL, HTTP error, too large, too slow); shown to the model."""


class NetworkDenied(FetchError):
    """The network policy refused the URL or the address it resolves to."""


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Caps of one fetch: bytes of the (decoded) body, seconds for the whole fetch with its redirects."""

    max_bytes: int = 10_000_000
    timeout_seconds: float = 30.0
    max_redirects: int = 5

    @classmethod
    def from_settings(cls, settings: Settings) -> FetchLimits:
        """The limits configured by ``SABRE_FETCH_*``."""
        return cls(
            max_bytes=settings.fetch_max_bytes,
            timeout_seconds=settings.fetch_timeout_seconds,
            max_redirects=settings.fetch_max_redirects,
        )


@functools.cache
def default_limits() -> FetchLimits:
    """The service's configured limits, read once (used when the caller did not pass its own)."""
    from app.config import Settings

    return FetchLimits.from_settings(Settings())


def _parse_entry(entry: str) -> str | IPNetwork:
    """A policy entry as a lower-case host pattern or an IP network (a bare IP is a /32 or /128)."""
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return entry.lower().rstrip(".")


def _host_matches(host: str, pattern: str) -> bool:
    """``*`` matches any host, ``*.example.com`` its subdomains (not itself), else an exact name."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """``ip`` and the IPv4 addresses it carries (mapped, 6to4, NAT64): each must pass the checks."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]  # ::ffff:a.b.c.d is a.b.c.d, nothing more
    found: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.sixtofour is not None:
            found.append(ip.sixtofour)
        if ip in _NAT64:
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _is_global(ip: IPAddress) -> bool:
    """One address (not what it embeds) is global unicast."""
    # IPv6 site-local (fec0::/10, deprecated but still a private network where used) is not in is_private.
    site_local = isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local
    return ip.is_global and not (
        ip.is_multicast
        or ip.is_reserved
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_unspecified
        or site_local
    )


def is_public(ip: IPAddress) -> bool:
    """Whether ``ip`` is a global unicast address, and so is every address it embeds."""
    return all(_is_global(a) for a in _embedded(ip))


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """A persona's ``network`` section, compiled; see the module docs for the rules."""

    allow_hosts: tuple[str, ...] = ()
    allow_nets: tuple[IPNetwork, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    deny_nets: tuple[IPNetwork, ...] = ()
    # Whether the persona listed anything under ``allow`` (then only those hosts may be fetched).
    restricted: bool = False
    schemes: frozenset[str] = field(default=SCHEMES)

    @classmethod
    def from_network(cls, network: Network | None) -> NetworkPolicy:
        """The policy of a persona (``None``: public hosts only, the default)."""
        if network is None:
            return cls()
        allow = [_parse_entry(e) for e in network.allow]
        deny = [_parse_entry(e) for e in network.deny]
        return cls(
            allow_hosts=tuple(e for e in allow if isinstance(e, str)),
            allow_nets=tuple(e for e in allow if not isinstance(e, str)),
            deny_hosts=tuple(e for e in deny if isinstance(e, str)),
            deny_nets=tuple(e for e in deny if not isinstance(e, str)),
            restricted=bool(allow),
        )

    @property
    def blocks_everything(self) -> bool:
        """``deny: ["*"]``: this persona's helpers may not use the network at all."""
        return "*" in self.deny_hosts

    def check_host(self, host: str) -> None:
        """Refuse a host name the policy denies, before any DNS query is made for it."""
        for pattern in self.deny_hosts:
            if _host_matches(host, pattern):
                raise NetworkDenied(f"{host} is denied by the network policy")

    def check_address(self, host: str, ip: IPAddress) -> None:
        """Refuse connecting to ``ip`` (an address of ``host``) unless the rules allow it."""
        self.check_host(host)
        addresses = _embedded(ip)
        if any(self._in(a, self.deny_nets) for a in addresses):
            raise NetworkDenied(f"{host} ({ip}) is denied by the network policy")
        explicitly_allowed = any(self._in(a, self.allow_nets) for a in addresses)
        # Every non-global part (the address, or an IPv4 address it embeds) must be listed itself.
        if not all(_is_global(a) or self._in(a, self.allow_nets) for a in addresses):
            what = f"{host} is" if host.strip("[]") == str(ip) else f"{host} resolves to {ip},"
            raise NetworkDenied(
                f"{what} a private, loopback or reserved address: not reachable from helpers unless "
                f"the persona's network.allow lists that address or range"
            )
        if (
            self.restricted
            and not explicitly_allowed
            and not any(_host_matches(host, pattern) for pattern in self.allow_hosts)
        ):
            raise NetworkDenied(f"{host} is not in the network policy's allow list")

    @staticmethod
    def _in(ip: IPAddress, nets: tuple[IPNetwork, ...]) -> bool:
        return any(ip.version == net.version and ip in net for net in nets)

    async def resolve(self, url: httpx.URL) -> IPAddress:
        """The first address of ``url``'s host that the policy allows (checked, to connect to)."""
        host = host_of(url)
        self.check_host(host)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            self.check_address(host, literal)
            return literal
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            # The resolver blocks a thread for as long as a name server takes (its own timeouts
            # outlast the fetch's): in a turn, the tenant's helper threads (app.helpers.threads),
            # not the default executor the service's own work needs.
            if helper_threads.bound():
                infos = await helper_threads.run_blocking(
                    socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM
                )
            else:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise FetchError(f"cannot resolve {host}: {exc}") from None
        first_refusal: NetworkDenied | None = None
        for info in infos:
            ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            try:
                self.check_address(host, ip)
            except NetworkDenied as exc:
                first_refusal = first_refusal or exc
                continue
            return ip
        raise first_refusal or FetchError(f"cannot resolve {host}: no address")


def host_of(url: httpx.URL) -> str:
    """The URL's host as DNS sees it: ASCII (IDNA), lower case, without a trailing dot."""
    return url.raw_host.decode("ascii").lower().rstrip(".")


def parse_url(url: object, *, schemes: frozenset[str] = SCHEMES) -> httpx.URL:
    """``url`` as an absolute http(s) URL with a host, or a FetchError saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise FetchError(f"expected a URL string, got {type(url).__name__}")
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, ValueError) as exc:
        raise FetchError(f"{url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in schemes:
        allowed = " and ".join(sorted(schemes))
        raise FetchError(f"{url!r}: only {allowed} URLs can be fetched")
    if not parsed.raw_host:
        raise FetchError(f"{url!r} has no host")
    return parsed


@dataclass(frozen=True, slots=True)
class Fetched:
    """One HTTP response, read whole (within the size cap)."""

    url: str
    """The final URL, after redirects."""
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        """The media type, lower case, without parameters (``""`` when the server sent none)."""
        message = Message()
        message["content-type"] = self.headers.get("content-type", "")
        return message.get_content_type() if self.headers.get("content-type") else ""

    @property
    def charset(self) -> str | None:
        """The declared character set, if any."""
        message = Message()
        message["content-type"] = self.headers.get("content-type", "")
        value = message.get_param("charset")
        return value if isinstance(value, str) else None

    def text(self) -> str:
        """The body decoded with the declared charset, else UTF-8 (bad bytes replaced)."""
        for encoding in (self.charset, "utf-8"):
            if not encoding:
                continue
            try:
                return self.body.decode(encoding, errors="replace")
            except (LookupError, ValueError):  # unknown, or a codec that cannot replace (idna)
                continue
        return self.body.decode("utf-8", errors="replace")


async def fetch(
    url: str,
    *,
    policy: NetworkPolicy,
    limits: FetchLimits,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    follow_redirects: bool = True,
    raise_for_status: bool = True,
) -> Fetched:
    """Fetch ``url`` under ``policy`` and ``limits``: every hop resolved, checked, and connected to
    by the checked address. Raises FetchError (NetworkDenied for the policy) on any failure, with a
    message for the model; HTTP error statuses are errors unless ``raise_for_status`` is off."""
    try:
        async with asyncio.timeout(limits.timeout_seconds):
            return await _fetch(
                parse_url(url, schemes=policy.schemes),
                policy=policy,
                limits=limits,
                method=method.upper(),
                headers=dict(headers or {}),
                content=content,
                follow_redirects=follow_redirects,
                raise_for_status=raise_for_status,
            )
    except TimeoutError:
        raise FetchError(f"{url}: no complete answer within {limits.timeout_seconds:g} s") from None


async def _fetch(
    current: httpx.URL,
    *,
    policy: NetworkPolicy,
    limits: FetchLimits,
    method: str,
    headers: dict[str, str],
    content: bytes | None,
    follow_redirects: bool,
    raise_for_status: bool,
) -> Fetched:
    for _ in range(limits.max_redirects + 1):
        ip = await policy.resolve(current)
        response = await _request(current, ip, method=method, headers=headers, content=content, limits=limits)
        location = response.headers.get("location")
        if not (follow_redirects and response.status in REDIRECT_STATUSES and location):
            if raise_for_status and response.status >= 400:
                raise FetchError(f"{current}: HTTP {response.status}")
            return response
        try:
            current = parse_url(str(current.join(location)), schemes=policy.schemes)
        except httpx.InvalidURL:
            raise FetchError(f"{current}: redirect to an invalid URL {location!r}") from None
        except FetchError as exc:
            raise FetchError(f"{current}: redirect refused: {exc}") from None
        if response.status in (301, 302, 303) and method != "HEAD":
            method, content = "GET", None
    raise FetchError(f"{current}: more than {limits.max_redirects} redirects")


async def _request(
    url: httpx.URL,
    ip: IPAddress,
    *,
    method: str,
    headers: dict[str, str],
    content: bytes | None,
    limits: FetchLimits,
) -> Fetched:
    """One request to ``ip`` (already checked) for ``url``; the body read up to the size cap."""
    host = host_of(url)
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}
    sent_headers = {"user-agent": USER_AGENT, **{k.lower(): v for k, v in headers.items()}}
    sent_headers["host"] = url.netloc.decode("ascii")
    sent_headers["accept-encoding"] = ACCEPT_ENCODING  # what BoundedDecoder reads, nothing else
    # A fresh client per hop: a pooled connection opened for one host must not carry another's request.
    async with httpx.AsyncClient(
        trust_env=False, follow_redirects=False, timeout=httpx.Timeout(limits.timeout_seconds)
    ) as client:
        request = client.build_request(
            method,
            url.copy_with(host=str(ip)),
            headers=sent_headers,
            content=content,
            extensions=extensions,
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise FetchError(f"{url}: {type(exc).__name__}: {exc or 'connection failed'}") from None
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limits.max_bytes:
                raise FetchError(f"{url}: the response is {int(declared):,} bytes, over the {_cap(limits)}")
            decoder = BoundedDecoder(url, response.headers.get("content-encoding", ""), limits)
            chunks = [decoder.decode(raw) async for raw in response.aiter_raw()]
            chunks.append(decoder.flush())
        except httpx.HTTPError as exc:
            raise FetchError(f"{url}: {type(exc).__name__}: {exc or 'read failed'}") from None
        finally:
            await response.aclose()
    return Fetched(
        url=str(url), status=response.status_code, headers=dict(response.headers), body=b"".join(chunks)
    )


class BoundedDecoder:
    """A response body's content decoding, never producing more than the size cap (plus a byte):
    however far a compressed chunk would expand, it is inflated only that far."""

    def __init__(self, url: httpx.URL, encoding: str, limits: FetchLimits) -> None:
        codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in _ZLIB_WBITS):
            raise FetchError(f"{url}: the response's content-encoding {encoding!r} is not supported")
        self.url, self.limits, self.size, self.received = url, limits, 0, 0
        self.coding = codings[0] if codings else None
        self._zlib = zlib.decompressobj(_ZLIB_WBITS[self.coding]) if self.coding else None
        self._started = False

    def decode(self, data: bytes) -> bytes:
        """The decoded bytes of the next ``data`` received; FetchError past the cap or on bad data."""
        self.received += len(data)  # empty deflate blocks would otherwise stream for ever
        if self.received > self.limits.max_bytes:
            raise FetchError(f"{self.url}: the response is larger than the {_cap(self.limits)}")
        if self._zlib is None:
            return self._counted(data)
        left = self.limits.max_bytes - self.size + 1  # one more than may come: more is over the cap
        try:
            out = self._zlib.decompress(data, left)
        except zlib.error as exc:
            if self.coding == "deflate" and not self._started:  # raw deflate, without zlib's header
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                self._started = True
                self.received -= len(data)  # counted again as it is decoded again
                return self.decode(data)
            raise FetchError(f"{self.url}: the {self.coding} body cannot be decoded: {exc}") from None
        self._started = True
        if self._zlib.unconsumed_tail:  # stopped at ``left``: there is more than the cap
            raise FetchError(f"{self.url}: the response is larger than the {_cap(self.limits)}")
        return self._counted(out)

    def flush(self) -> bytes:
        """What the decoder still holds at the end of the body."""
        if self._zlib is None:
            return b""
        try:
            return self._counted(self._zlib.flush())
        except zlib.error as exc:
            raise FetchError(f"{self.url}: the {self.coding} body cannot be decoded: {exc}") from None

    def _counted(self, data: bytes) -> bytes:
        self.size += len(data)
        if self.size > self.limits.max_bytes:
            raise FetchError(f"{self.url}: the response is larger than the {_cap(self.limits)}")
        return data


def _cap(limits: FetchLimits) -> str:
    return f"limit of {limits.max_bytes:,} bytes per response"
