"""TLS and bearer tokens for channels to dispatchd, as the C++ SDK's (client/cpp/credentials.h).

Every tool takes the same flags and environment variables: --tls-ca (DISPATCHD_TLS_CA), the PEM
file of the CA that signed the daemon's certificate (set: the channel uses TLS); --tls-cert and
--tls-key (DISPATCHD_TLS_CERT, DISPATCHD_TLS_KEY), this client's certificate and key for mutual
TLS; --token-file (DISPATCHD_TOKEN_FILE), a file whose first line is the bearer token, sent as
`authorization: Bearer <token>` metadata on every call (plain metadata, so that it also reaches a
daemon that takes tokens on loopback without TLS)."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import grpc

ChannelOptions = Sequence[Tuple[str, object]]


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag}: cannot read {path}: {e.strerror}") from None


class Security:
    """Where a client's or worker's credentials are; all None: plaintext, no token."""

    def __init__(self, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token_file: Optional[str] = None) -> None:
        self.tls_ca = tls_ca or None
        self.tls_cert = tls_cert or None
        self.tls_key = tls_key or None
        self.token_file = token_file or None

    @classmethod
    def from_env(cls) -> "Security":
        """The four DISPATCHD_* environment variables (unset ones stay None)."""
        return cls(os.environ.get("DISPATCHD_TLS_CA"), os.environ.get("DISPATCHD_TLS_CERT"),
                   os.environ.get("DISPATCHD_TLS_KEY"), os.environ.get("DISPATCHD_TOKEN_FILE"))

    def channel(self, target: str, options: ChannelOptions) -> grpc.Channel:
        """A channel to `target` with these credentials. ValueError naming the flag for a file
        that cannot be read, or a certificate without its key."""
        creds = self._credentials()
        if creds is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, creds, options=options)

    def aio_channel(self, target: str, options: ChannelOptions) -> "grpc.aio.Channel":
        """As channel(), for asyncio (grpc.aio), bound to the running event loop."""
        creds = self._credentials()
        if creds is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, creds, options=options)

    def _credentials(self) -> Optional[grpc.ChannelCredentials]:
        """The TLS credentials; None for plaintext."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if not self.tls_ca:
            if self.tls_cert:
                raise ValueError("--tls-cert: needs --tls-ca (the daemon's CA)")
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca, "--tls-ca"),
            private_key=_read(self.tls_key, "--tls-key") if self.tls_key else None,
            certificate_chain=_read(self.tls_cert, "--tls-cert") if self.tls_cert else None)

    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        """The call metadata carrying the token: () without one. ValueError for an unreadable or
        empty token file."""
        if not self.token_file:
            return ()
        token = _read(self.token_file, "--token-file").decode("utf-8", "replace")
        token = token.split("\n", 1)[0].strip()
        if not token:
            raise ValueError(f"--token-file: {self.token_file} holds no token")
        return (("authorization", f"Bearer {token}"),)
