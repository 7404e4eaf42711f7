#!/usr/bin/python3
"""A small OIDC client-credentials token endpoint, for the secured broker's
OAUTHBEARER listener (scripts/services/secure.sh) and tests/it/secure.rs.

  POST /token   grant_type=client_credentials, the client's id and secret by
                HTTP Basic or in the form: an RS256 JWT from PyJWT (Debian's
                python3-jwt), with sub, iss, aud, iat, exp and scope
  GET  /jwks    the public key the broker validates those tokens with

Clients are given as --client ID:SECRET. The key is a PEM file made by
openssl. Binds loopback only.
"""

import argparse
import base64
import json
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives import serialization

KID = "docstream-test"
AUDIENCE = "kafka"
LIFETIME_S = 3600


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True, help="an RSA private key, PEM")
    parser.add_argument("--client", action="append", default=[], help="ID:SECRET")
    args = parser.parse_args()
    with open(args.key, "rb") as f:
        private = serialization.load_pem_private_key(f.read(), password=None)
    public_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    public_jwk.update({"kid": KID, "use": "sig", "alg": "RS256"})
    clients = dict(c.split(":", 1) for c in args.client)
    issuer = f"http://127.0.0.1:{args.port}"

    class Handler(BaseHTTPRequestHandler):
        def answer(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path == "/jwks":
                self.answer(200, {"keys": [public_jwk]})
            else:
                self.answer(404, {"error": "not_found"})

        def do_POST(self):
            if self.path != "/token":
                return self.answer(404, {"error": "not_found"})
            length = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            field = lambda name: (form.get(name) or [""])[0]
            client_id, secret = field("client_id"), field("client_secret")
            basic = self.headers.get("Authorization", "")
            if basic.lower().startswith("basic "):
                decoded = base64.b64decode(basic[6:]).decode()
                client_id, _, secret = decoded.partition(":")
                client_id = urllib.parse.unquote_plus(client_id)
                secret = urllib.parse.unquote_plus(secret)
            if field("grant_type") != "client_credentials":
                return self.answer(400, {"error": "unsupported_grant_type"})
            if clients.get(client_id) != secret or not client_id:
                return self.answer(401, {"error": "invalid_client"})
            now = int(time.time())
            claims = {
                "sub": client_id,
                "iss": issuer,
                "aud": AUDIENCE,
                "iat": now,
                "exp": now + LIFETIME_S,
                "scope": field("scope") or "kafka",
            }
            token = jwt.encode(claims, private, algorithm="RS256", headers={"kid": KID})
            self.answer(200, {"access_token": token, "token_type": "bearer", "expires_in": LIFETIME_S})

        def log_message(self, fmt, *args):
            print(f"{self.address_string()} {fmt % args}", flush=True)

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
