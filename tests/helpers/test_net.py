"""The network policy: no SSRF by default, persona allow/deny on top, size and time caps."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import pytest

from app.helpers.net import (
    FetchError,
    FetchLimits,
    NetworkDenied,
    NetworkPolicy,
    default_limits,
    fetch,
    is_public,
)
from app.personas.models import Network
from tests.helpers.conftest import SMALL_LIMITS, WebServer

LOOPBACK = NetworkPolicy.from_network(Network(allow=("127.0.0.1",)))
DEFAULT = NetworkPolicy.from_network(None)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.5.5.5",
        "10.0.0.1",
        "172.16.3.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fec0::1",  # site-local (deprecated, RFC 3879): still a private network where it is used
        "feff::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::a00:1",
        "2002:7f00:1::",
    ],
)
def test_non_public_addresses_are_denied_by_default(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert not is_public(ip)
    with pytest.raises(NetworkDenied, match="private, loopback or reserved"):
        DEFAULT.check_address("some.host", ip)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass_the_default_policy(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert is_public(ip)
    DEFAULT.check_address("example.com", ip)


def test_allow_list_restricts_public_hosts_by_name_wildcard_and_cidr() -> None:
    policy = NetworkPolicy.from_network(Network(allow=("example.org", "*.wiki.org", "8.8.8.0/24")))
    public = ipaddress.ip_address("93.184.216.34")
    policy.check_address("example.org", public)
    policy.check_address("en.wiki.org", public)
    policy.check_address("dns.google", ipaddress.ip_address("8.8.8.8"))
    for host in ("other.com", "wiki.org", "example.org.evil.com"):
        with pytest.raises(NetworkDenied, match="not in the network policy's allow list"):
            policy.check_address(host, public)


def test_star_and_host_names_never_open_private_addresses() -> None:
    policy = NetworkPolicy.from_network(Network(allow=("*", "localhost", "internal.corp")))
    for host, address in (
        ("localhost", "127.0.0.1"),
        ("internal.corp", "10.1.2.3"),
        ("x", "169.254.169.254"),
    ):
        with pytest.raises(NetworkDenied, match="private"):
            policy.check_address(host, ipaddress.ip_address(address))


def test_an_explicit_private_cidr_is_the_way_in_and_deny_wins() -> None:
    allowed = NetworkPolicy.from_network(Network(allow=("10.0.0.0/8",)))
    allowed.check_address("db.internal", ipaddress.ip_address("10.9.8.7"))
    allowed.check_address("mapped", ipaddress.ip_address("::ffff:10.9.8.7"))
    with pytest.raises(NetworkDenied):
        allowed.check_address("other", ipaddress.ip_address("192.168.0.1"))
    for deny in (("10.9.0.0/16",), ("db.internal",), ("*.internal",), ("*",)):
        policy = NetworkPolicy.from_network(Network(allow=("10.0.0.0/8", "*"), deny=deny))
        with pytest.raises(NetworkDenied, match="denied by the network policy"):
            policy.check_address("db.internal", ipaddress.ip_address("10.9.8.7"))


async def test_loopback_server_is_unreachable_by_default(web: WebServer) -> None:
    for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "0x7f.1"):
        with pytest.raises(NetworkDenied):
            await fetch(web.url("/article.html", host=host), policy=DEFAULT, limits=SMALL_LIMITS)
    assert not [s for s in web.seen if s.path == "/article.html" and "2130706433" in s.host]


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/"]
)
async def test_private_targets_are_refused_before_connecting(url: str) -> None:
    with pytest.raises(NetworkDenied):
        await asyncio.wait_for(fetch(url, policy=DEFAULT, limits=SMALL_LIMITS), timeout=2)


async def test_allowed_loopback_fetch_keeps_the_host_name(web: WebServer) -> None:
    page = await fetch(web.url("/data.csv", host="localhost"), policy=LOOPBACK, limits=SMALL_LIMITS)
    assert page.status == 200
    assert page.content_type == "text/csv"
    assert page.body.decode() == "month,revenue\nJan,100\nFeb,120\nMar,90\n"
    assert web.seen[-1].host == f"localhost:{web.port}"


async def test_deny_wins_over_allow(web: WebServer) -> None:
    for deny in ("127.0.0.1", "localhost", "*"):
        policy = NetworkPolicy.from_network(Network(allow=("127.0.0.0/8",), deny=(deny,)))
        with pytest.raises(NetworkDenied, match="denied"):
            await fetch(web.url("/data.csv", host="localhost"), policy=policy, limits=SMALL_LIMITS)


async def test_redirects_are_followed_and_each_hop_is_checked(web: WebServer) -> None:
    page = await fetch(web.url("/to-article"), policy=LOOPBACK, limits=SMALL_LIMITS)
    assert page.url.endswith("/article.html")
    for path in ("/to-private", "/to-metadata"):
        with pytest.raises(NetworkDenied, match="private"):
            await fetch(web.url(path), policy=LOOPBACK, limits=SMALL_LIMITS)
    with pytest.raises(FetchError, match=r"redirect refused: .*only http and https"):
        await fetch(web.url("/to-file"), policy=LOOPBACK, limits=SMALL_LIMITS)
    with pytest.raises(FetchError, match="more than 3 redirects"):
        await fetch(web.url("/loop"), policy=LOOPBACK, limits=SMALL_LIMITS)


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/", "javascript:alert(1)", "/relative"],
)
async def test_only_http_and_https(url: str) -> None:
    with pytest.raises(FetchError, match=r"only http and https|no host"):
        await fetch(url, policy=LOOPBACK, limits=SMALL_LIMITS)


async def test_not_a_url() -> None:
    with pytest.raises(FetchError, match="expected a URL string"):
        await fetch(42, policy=LOOPBACK, limits=SMALL_LIMITS)  # type: ignore[arg-type]
    with pytest.raises(FetchError):
        await fetch("http://exa mple.com:99999/", policy=LOOPBACK, limits=SMALL_LIMITS)


async def test_size_cap_by_declared_length_and_by_counting(web: WebServer) -> None:
    for path in ("/huge", "/huge-streamed"):
        with pytest.raises(FetchError, match="200,000 bytes"):
            await fetch(web.url(path), policy=LOOPBACK, limits=SMALL_LIMITS)
    roomy = FetchLimits(max_bytes=2_000_000, timeout_seconds=5)
    assert len((await fetch(web.url("/huge"), policy=LOOPBACK, limits=roomy)).body) == 1_000_000


def test_default_limits_are_ten_megabytes_and_thirty_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SABRE_FETCH_MAX_BYTES", raising=False)
    monkeypatch.delenv("SABRE_FETCH_TIMEOUT_SECONDS", raising=False)
    default_limits.cache_clear()
    try:
        assert default_limits().max_bytes == 10_000_000
        assert default_limits().timeout_seconds == 30
        monkeypatch.setenv("SABRE_FETCH_MAX_BYTES", "5000")
        default_limits.cache_clear()
        assert default_limits().max_bytes == 5000
    finally:
        default_limits.cache_clear()


async def test_timeout(web: WebServer) -> None:
    with pytest.raises(FetchError, match=r"no complete answer within 0.5 s"):
        await fetch(web.url("/slow"), policy=LOOPBACK, limits=FetchLimits(timeout_seconds=0.5))


async def test_http_errors_raise_unless_asked_not_to(web: WebServer) -> None:
    with pytest.raises(FetchError, match="HTTP 404"):
        await fetch(web.url("/missing"), policy=LOOPBACK, limits=SMALL_LIMITS)
    page = await fetch(web.url("/missing"), policy=LOOPBACK, limits=SMALL_LIMITS, raise_for_status=False)
    assert page.status == 404


async def test_dns_rebinding_cannot_switch_the_address_after_the_check(
    web: WebServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name is resolved once per hop, by the policy, and the connection goes to that address:
    a resolver that answers 127.0.0.1 first and a private address afterwards changes nothing, and
    nothing else (httpx, the socket layer) ever resolves the name again."""
    answers = iter(["127.0.0.1"])
    calls: list[str] = []
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return await real(host, port, *args, **kwargs)
        calls.append(host)
        address = next(answers, "10.0.0.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    def refuse(host: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{host} was resolved outside the policy")

    monkeypatch.setattr(loop, "getaddrinfo", rebinding)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    page = await fetch(web.url("/data.csv", host="rebind.test"), policy=LOOPBACK, limits=SMALL_LIMITS)
    assert page.status == 200
    assert calls == ["rebind.test"]
    assert web.seen[-1].host == f"rebind.test:{web.port}"
    with pytest.raises(NetworkDenied):  # the second resolution answers a private address
        await fetch(web.url("/data.csv", host="rebind.test"), policy=LOOPBACK, limits=SMALL_LIMITS)
