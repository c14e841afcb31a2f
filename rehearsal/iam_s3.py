"""The rehearsal's S3 under the deployed roles' permissions.

moto enforces no IAM, so a missing permission would first show on AWS. This proxy stands in
front of moto and judges every request by the IAM policies CloudFormation would attach to the
caller's role, read from the synthesized templates (`python app.py` with the rehearsal's bucket,
run and nodes): the training nodes' role, the preprocessing node's and the run controller's
steps' (the controller's program runs under it, as the key `controller`). A request its role may not make is answered as S3 answers it:
403 AccessDenied. A read of a missing key is 403 too, not 404, when the role may not list the
bucket without a prefix condition, as on S3 ("If you don't have the s3:ListBucket permission,
Amazon S3 returns an HTTP status code 403", https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html).

The caller is told by its access key id, which the rehearsal sets per process: `node`,
`preprocessor`, `controller`; any other key (the rehearsal itself, the user's `horovod-fleet`
command) is not judged. Modelled: Allow and Deny statements, `*` and `?` in actions and
resources, StringEquals/StringLike (and their Not forms) on the request's `s3:prefix`. Not
modelled: bucket policies, SCPs, permission boundaries, KMS, other condition keys (a statement
with one never matches), and any service but S3: a request of another service (the drill's
FIS) goes to moto unjudged. Every refusal is one line in the log file. `cut` plays an S3 cut of
the fleet's subnet (the drill's aws:network:disrupt-connectivity, scope s3).
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ACCOUNT = "123456789012"
# The role whose policies judge each access key; the logical-id prefix of the role in the
# synthesized templates (Ref or an import of TeardownStack's export).
ROLES = {
    "node": "FleetRole",
    "preprocessor": "PreprocessorRole",
    "controller": "RunControllerStepsRole",
}
# The access key and the service of a SigV4 request's scope (key/date/region/service/...).
CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/(?:\d{8}/[^/]+/([^/]+)/)?")
DELETE_KEY = re.compile(r"<Key>([^<]+)</Key>")


def resolve(value, region: str):
    """A policy value with CloudFormation's intrinsics replaced by what they would be."""
    if isinstance(value, list):
        return [resolve(item, region) for item in value]
    if not isinstance(value, dict):
        return value
    if "Ref" in value:
        pseudo = {"AWS::Partition": "aws", "AWS::Region": region, "AWS::AccountId": ACCOUNT}
        return pseudo.get(value["Ref"], "${" + value["Ref"] + "}")
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(str(resolve(part, region)) for part in parts)
    if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        return (
            value["Fn::Sub"].replace("${AWS::AccountId}", ACCOUNT).replace("${AWS::Region}", region)
        )
    if "Fn::GetAtt" in value:
        return "${" + ".".join(value["Fn::GetAtt"]) + "}"
    if "Fn::ImportValue" in value:
        return "${import:" + str(resolve(value["Fn::ImportValue"], region)) + "}"
    return {key: resolve(item, region) for key, item in value.items()}


def role_statements(templates: list[dict], region: str) -> dict[str, list[dict]]:
    """Each judged role's policy statements, from every AWS::IAM::Policy attached to it."""
    statements: dict[str, list[dict]] = {name: [] for name in ROLES}
    for template in templates:
        for resource in template.get("Resources", {}).values():
            if resource.get("Type") != "AWS::IAM::Policy":
                continue
            roles = json.dumps(resource["Properties"].get("Roles", []))
            for name, prefix in ROLES.items():
                # An import names the role after "Ref" (TeardownStack:ExportsOutputRef<Role>...).
                if re.search(rf'"(Ref|Fn::ImportValue)": "([^"]*Ref)?{prefix}', roles):
                    document = resolve(resource["Properties"]["PolicyDocument"], region)
                    statements[name] += document["Statement"]
    return statements


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def matches(patterns, value: str, ignore_case: bool = False) -> bool:
    if ignore_case:
        return any(fnmatch.fnmatchcase(value.lower(), p.lower()) for p in as_list(patterns))
    return any(fnmatch.fnmatchcase(value, p) for p in as_list(patterns))


def condition_holds(condition: dict, context: dict[str, str]) -> bool:
    for operator, tests in condition.items():
        for key, expected in tests.items():
            if key not in context:
                return False
            actual = context[key]
            if operator == "StringEquals":
                ok = actual in as_list(expected)
            elif operator == "StringNotEquals":
                ok = actual not in as_list(expected)
            elif operator == "StringLike":
                ok = matches(expected, actual)
            elif operator == "StringNotLike":
                ok = not matches(expected, actual)
            else:
                return False
            if not ok:
                return False
    return True


def allowed(statements: list[dict], action: str, resource: str, context: dict[str, str]) -> bool:
    """IAM's identity-policy evaluation: an explicit Deny wins, else any Allow, else denied."""
    verdict = False
    for statement in statements:
        if not matches(statement.get("Action", []), action, ignore_case=True):
            continue
        if not matches(statement.get("Resource", []), resource):
            continue
        if not condition_holds(statement.get("Condition", {}), context):
            continue
        if statement.get("Effect") == "Deny":
            return False
        verdict = True
    return verdict


def s3_actions(method: str, path: str, query: dict, headers, body: bytes) -> list[tuple]:
    """The (action, resource ARN, condition context) a path-style S3 request needs."""
    bucket, _, key = urllib.parse.unquote(path.lstrip("/")).partition("/")
    bucket_arn = f"arn:aws:s3:::{bucket}"
    if not key:
        if "location" in query:
            return [("s3:GetBucketLocation", bucket_arn, {})]
        if "uploads" in query:
            return [("s3:ListBucketMultipartUploads", bucket_arn, {})]
        if method == "POST" and "delete" in query:
            keys = DELETE_KEY.findall(body.decode(errors="replace"))
            return [("s3:DeleteObject", f"{bucket_arn}/{k}", {}) for k in keys]
        if method in ("GET", "HEAD"):
            context = {"s3:prefix": query["prefix"][0]} if "prefix" in query else {}
            return [("s3:ListBucket", bucket_arn, context)]
        return [(f"s3:{method.title()}Bucket", bucket_arn, {})]
    object_arn = f"{bucket_arn}/{key}"
    if method in ("GET", "HEAD"):
        if "uploadId" in query:
            return [("s3:ListMultipartUploadParts", object_arn, {})]
        return [("s3:GetObject", object_arn, {})]
    if method == "DELETE":
        if "uploadId" in query:
            return [("s3:AbortMultipartUpload", object_arn, {})]
        return [("s3:DeleteObject", object_arn, {})]
    needed = [("s3:PutObject", object_arn, {})]  # PUT, uploads, parts, completion
    if source := headers.get("x-amz-copy-source"):
        source = urllib.parse.unquote(source.lstrip("/").split("?")[0])
        needed.append(("s3:GetObject", f"arn:aws:s3:::{source}", {}))
    return needed


class IamS3Proxy:
    """A threaded HTTP proxy to moto at `upstream` (host, port), listening on `listen`."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        statements: dict[str, list[dict]],
        log_path: Path,
    ) -> None:
        self.upstream = upstream
        self.statements = statements
        self.log_path = log_path
        self.refusals: list[str] = []
        # (method, path pattern, action): the first request that matches, once S3 has answered
        # it, runs the action (the fault rehearsal injects faults at a request this way).
        self.watches: list[tuple[str, re.Pattern, Callable[[], None]]] = []
        self.lock = threading.Lock()
        self.pace: Pace | None = None  # a throttle on some reads (Pace), for a measurement
        # An S3 cut (cut()): until then, S3 requests from every address but these go unanswered.
        self.cut_until, self.cut_keep = 0.0, set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # the refusals are what matters
                pass

            def handle_one(self) -> None:
                proxy.serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = ThreadingHTTPServer(listen, Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def refuse(self, line: str) -> None:
        with self.lock:
            self.refusals.append(line)
            with self.log_path.open("a") as out:
                out.write(line + "\n")

    def cut(self, keep: set[str], seconds: float) -> None:
        """S3 cut off from every client address but `keep` for `seconds` (a subnet's network
        ACL denying S3's traffic: FIS's disrupt-connectivity, scope s3): each S3 request from
        them is held to the cut's end, then its connection closed unanswered, as a dropped
        packet leaves the caller to time out and try again. Other services still answer."""
        with self.lock:
            self.cut_until, self.cut_keep = time.time() + seconds, set(keep)

    def dropped(self, request: BaseHTTPRequestHandler) -> bool:
        with self.lock:
            until, keep = self.cut_until, self.cut_keep
        if time.time() >= until or request.client_address[0] in keep:
            return False
        time.sleep(max(0.0, until - time.time()))
        request.close_connection = True
        return True

    def serve(self, request: BaseHTTPRequestHandler) -> None:
        body = read_body(request)
        parsed = urllib.parse.urlsplit(request.path)
        query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        auth = request.headers.get("Authorization", "") + " " + parsed.query
        found = CREDENTIAL.search(auth) or re.search(r"X-Amz-Credential=([^%/&]+)", auth)
        role = found.group(1) if found else ""
        service = (found.group(2) if found and found.re is CREDENTIAL else None) or "s3"
        if service != "s3":  # another service of moto's (the drill's FIS): not judged, not cut
            status, headers, answer = self.forward(request, body)
            return reply(request, status, answer, headers)
        if self.dropped(request):
            return None
        if role in self.statements:
            statements = self.statements[role]
            for action, resource, context in s3_actions(
                request.command, parsed.path, query, request.headers, body
            ):
                if not allowed(statements, action, resource, context):
                    shown = f" with s3:prefix {context['s3:prefix']!r}" if context else ""
                    self.refuse(f"IAM: role {role} may not {action} on {resource}{shown}")
                    return reply(request, 403, access_denied(resource))
        status, headers, answer = self.forward(request, body)
        if status == 404 and role in self.statements and request.command in ("GET", "HEAD"):
            bucket = parsed.path.lstrip("/").split("/", 1)[0]
            if not allowed(self.statements[role], "s3:ListBucket", f"arn:aws:s3:::{bucket}", {}):
                # S3 does not tell a caller that may not list the bucket what is absent.
                return reply(request, 403, access_denied(parsed.path))
        paced = self.pace if self.pace and self.pace.applies(request.command, parsed.path) else None
        reply(request, status, answer, headers, paced and paced.sender(request.client_address[0]))
        self.run_watches(request.command, parsed.path)

    def on_request(self, method: str, path: re.Pattern, action: Callable[[], None]) -> None:
        with self.lock:
            self.watches.append((method, path, action))

    def run_watches(self, method: str, path: str) -> None:
        with self.lock:
            due = [w for w in self.watches if w[0] == method and w[1].search(path)]
            self.watches = [w for w in self.watches if w not in due]
        for _, _, action in due:
            action()

    def forward(self, request: BaseHTTPRequestHandler, body: bytes):
        connection = http.client.HTTPConnection(*self.upstream, timeout=600)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "transfer-encoding"}
        headers["Content-Length"] = str(len(body))
        connection.request(request.command, request.path, body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read()
        kept = [(k, v) for k, v in response.getheaders() if k.lower() != "transfer-encoding"]
        connection.close()
        return response.status, kept, answer


def read_body(request: BaseHTTPRequestHandler) -> bytes:
    if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while size := int(request.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(request.rfile.read(size))
            request.rfile.readline()
        request.rfile.readline()
        return b"".join(chunks)
    return request.rfile.read(int(request.headers.get("Content-Length") or 0))


def access_denied(resource: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
        f"<Message>Access Denied</Message><Resource>{resource}</Resource></Error>"
    ).encode()


class Pace:
    """At most `bytes_per_s` a second of GET bodies whose path matches `path`, for each client
    address (each simulated host's network), shared by its connections: a slow network, so
    that a measurement of the pull beside the start-up has a pull that takes visible time."""

    CHUNK = 64 * 1024

    def __init__(self, path: re.Pattern, bytes_per_s: float) -> None:
        self.path, self.bytes_per_s = path, bytes_per_s
        self.free_at: dict[str, float] = {}
        self.lock = threading.Lock()

    def applies(self, method: str, path: str) -> bool:
        return method == "GET" and bool(self.path.search(path))

    def sender(self, client: str) -> Callable[[object, bytes], None]:
        def send(out, body: bytes) -> None:
            for start in range(0, len(body), self.CHUNK):
                chunk = body[start : start + self.CHUNK]
                with self.lock:
                    at = max(time.monotonic(), self.free_at.get(client, 0.0))
                    self.free_at[client] = at + len(chunk) / self.bytes_per_s
                time.sleep(max(0.0, at - time.monotonic()))
                out.write(chunk)

        return send


def reply(
    request,
    status: int,
    body: bytes,
    headers: list | None = None,
    send: Callable[[object, bytes], None] | None = None,
) -> None:
    """Send S3's answer on; a HEAD's Content-Length is the object's, not this empty body's.
    send(out, body) writes the body (a Pace's), else it is written at once."""
    request.send_response(status)
    length = str(len(body))
    for key, value in headers or [("Content-Type", "application/xml")]:
        if key.lower() == "content-length" and request.command == "HEAD":
            length = value
        if key.lower() in ("content-length", "connection", "date", "server"):
            continue
        request.send_header(key, value)
    request.send_header("Content-Length", length)
    request.end_headers()
    if request.command != "HEAD":
        (send or (lambda out, data: out.write(data)))(request.wfile, body)
