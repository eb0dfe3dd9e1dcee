"""Where the worker may send a request that carries a secret (a model endpoint's key, a webhook's
signed body): never to a link-local or cloud metadata address, and to loopback or a private
network only when the setting that governs the destination allows it.

`destination_check(url, allow_private=…)` resolves the URL's host and checks every address it
resolves to (a name that resolves to one public and one internal address is refused); it returns
the addresses checked, and `pinned_opener` connects to one of them, so that a name that resolves
differently a moment later (DNS rebinding) cannot move the request elsewhere.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Instance metadata services answer here with the machine's cloud credentials; link-local as a
# whole (169.254.0.0/16, fe80::/10) is refused besides.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean ...
        "169.254.170.2",  # AWS ECS task credentials
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
    )
)
# Networks that are not the internet: loopback, RFC 1918, unique-local, shared address space.
_PRIVATE = tuple(
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
              "::1/128", "fc00::/7")
)  # fmt: skip


class DestinationRefused(ValueError):
    """The URL's host is, or resolves to, an address the worker does not send secrets to."""


def address_refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a request may not go to `address`, or None when it may."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return address_refusal(mapped, allow_private=allow_private)
    if address in METADATA:
        return f"{address} is a cloud metadata address"
    if address.is_link_local:
        return f"{address} is link-local"
    if address.is_unspecified or address.is_multicast:
        return f"{address} is not a host"
    if any(address in network for network in _PRIVATE) or address.is_private:
        if allow_private:
            return None
        return f"{address} is loopback or private (its setting does not allow private addresses)"
    if address.is_reserved:
        return f"{address} is reserved"
    return None


# Names that are always the machine itself or its metadata service, refused without a lookup.
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_METADATA_NAMES = ("metadata.google.internal", "metadata", "instance-data")


def _refuse(host: str, why: str, setting: str) -> DestinationRefused:
    hint = f"; set {setting}=true to allow it" if setting and "private" in why else ""
    return DestinationRefused(f"{host[:200]}: {why}{hint}")


def destination_check(
    url: str, *, allow_private: bool, setting: str = "", resolve: bool = True
) -> list[IPAddress]:
    """The addresses `url`'s host resolves to, each one allowed; DestinationRefused otherwise
    (naming `setting`, the opt-in for private addresses, when that is what refused it).

    Without `resolve` (checking a URL as it is configured, where the name may not resolve yet)
    only an address written in the URL and the names that are always local are checked, and
    nothing is returned; the request itself checks again with `resolve`."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise DestinationRefused(f"{url[:200]!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise DestinationRefused(f"{url[:200]!r} is not an http(s) URL with a host")
    name = host.rstrip(".").lower()
    if name in _METADATA_NAMES:
        raise _refuse(host, "is a cloud metadata service", setting)
    if (name in _LOCAL_NAMES or name.endswith(".localhost")) and not allow_private:
        raise _refuse(
            host, "is loopback or private (its setting does not allow private addresses)", setting
        )
    if not resolve:
        try:
            literal = ipaddress.ip_address(name.partition("%")[0])
        except ValueError:
            return []
        why = address_refusal(literal, allow_private=allow_private)
        if why is not None:
            raise _refuse(host, why, setting)
        return [literal]
    default = 443 if parts.scheme == "https" else 80
    try:
        infos = socket.getaddrinfo(host, port or default, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DestinationRefused(f"cannot resolve {host[:200]!r}: {exc}") from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).partition("%")[0])
        why = address_refusal(address, allow_private=allow_private)
        if why is not None:
            raise _refuse(host, why, setting)
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise DestinationRefused(f"{host[:200]!r} resolves to no address")
    return addresses


def _pinned(connection: http.client.HTTPConnection, addresses: Sequence[IPAddress]) -> None:
    """Connect `connection` to the checked addresses, not to whatever its host resolves to now;
    HTTPS still verifies the certificate against the host's name."""

    def connect(_: Any, timeout: Any = None, source_address: Any = None) -> socket.socket:
        error: OSError | None = None
        for address in addresses:
            try:
                return socket.create_connection(
                    (str(address), connection.port), timeout, source_address
                )
            except OSError as exc:
                error = exc
        raise error or OSError("no address to connect to")

    connection._create_connection = connect  # type: ignore[attr-defined]


class _PinnedHTTP(urllib.request.HTTPHandler):
    def __init__(self, addresses: Sequence[IPAddress]) -> None:
        super().__init__()
        self.addresses = addresses

    def http_open(self, req: urllib.request.Request) -> Any:
        def build(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            connection = http.client.HTTPConnection(host, **kwargs)
            _pinned(connection, self.addresses)
            return connection

        return self.do_open(build, req)


class _PinnedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, addresses: Sequence[IPAddress]) -> None:
        super().__init__()
        self.addresses = addresses

    def https_open(self, req: urllib.request.Request) -> Any:
        def build(host: str, **kwargs: Any) -> http.client.HTTPSConnection:
            connection = http.client.HTTPSConnection(host, **kwargs)
            _pinned(connection, self.addresses)
            return connection

        return self.do_open(build, req, context=self._context)  # type: ignore[attr-defined]


def pinned_opener(
    addresses: Sequence[IPAddress], *handlers: urllib.request.BaseHandler
) -> urllib.request.OpenerDirector:
    """A urllib opener whose connections go to `addresses` (from `destination_check`) only:
    directly, never through a proxy from the environment (which would be the one connected to)."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _PinnedHTTP(addresses), _PinnedHTTPS(addresses), *handlers
    )
