"""Tell CloudFormation whether the preprocessing node's environment is ready.

    python3 -m bootstrap.preprocess.ready_signal [--node-json PATH] SUCCESS|FAILURE REASON

PreprocessStack waits on an AWS::CloudFormation::WaitCondition whose handle URL is node.json's
`ready_signal_url`. A signal sent there carries a reason, and CloudFormation shows a FAILURE's
reason in the deploy output, so `cdk deploy PreprocessStack` fails saying which step broke.
Standard library only: it must work when the step that failed is the Python environment itself.
Without a `ready_signal_url` (the rehearsal) it prints that and does nothing.
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-waitcondition.html
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from bootstrap.cli import OneLineErrorParser, usage_error
from bootstrap.node_config import DEFAULT_PATH

# One node signals once, so any fixed id is unique; CloudFormation prints it with the reason.
UNIQUE_ID = "preprocessing-node"
# The Reason CloudFormation keeps is short: the step and the exit say what broke.
MAX_REASON = 1000


def signal_document(status: str, reason: str) -> bytes:
    """The JSON a wait condition handle accepts."""
    reason = " ".join(reason.split())[:MAX_REASON]
    return json.dumps(
        {"Status": status, "Reason": reason, "UniqueId": UNIQUE_ID, "Data": reason}
    ).encode()


def send(url: str, status: str, reason: str, timeout_s: float = 30) -> None:
    """PUT the signal to the presigned handle URL (no content type: it is part of the signature)."""
    request = urllib.request.Request(
        url, data=signal_document(status, reason), method="PUT", headers={"Content-Type": ""}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        reply.read()


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap.preprocess.ready_signal")
    parser.add_argument("--node-json", default=DEFAULT_PATH, help="the node's configuration")
    parser.add_argument("status", choices=("SUCCESS", "FAILURE"))
    parser.add_argument("reason")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(Path(args.node_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return usage_error(f"node.json: cannot read {args.node_json}: {exc}")
    url = doc.get("ready_signal_url") if isinstance(doc, dict) else None
    if not url:
        print(f"no ready_signal_url in node.json: {args.status} not signalled")
        return 0
    try:
        send(url, args.status, args.reason)
    except OSError as exc:
        print(f"error: could not signal {args.status} to CloudFormation: {exc}", file=sys.stderr)
        return 1
    print(f"signalled {args.status} to PreprocessStack: {args.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
