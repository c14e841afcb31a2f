"""The run controller's workflow offline: the state machine TeardownStack synthesizes, executed by
moto's ASL interpreter (mock_aws with `execute_state_machine`), every state's real step code run
in process, against moto's EC2 and CloudFormation (and S3: moto's, or the rehearsal's local S3
endpoint); its waits scaled down and recorded. The tests of tests/stacks drive it, and so does
the rehearsal's attempt loop (rehearsal/cloud.py): one workflow definition, the one deployed.

How (notes of the research that found it, /work/notes/run-engine-research.md §1, §3):
- moto's Lambda runs code in Docker; LambdaFunction.invoke is replaced by a call of the
  function's handler (its template `Handler`, module.function of the asset) that answers as
  Lambda's Python runtime does, an error as {"errorType": <class name>, ...}, which the
  interpreter turns into the state's error name, as Step Functions does.
- Wait states and Retry intervals really sleep in moto: the Wait function's interval and the
  retrier's clock are scaled by SCALE, and every wait is recorded with its execution and state.
- The DefinitionString's tokens (Fn::GetAtt of the step functions, Ref of pseudo parameters) are
  resolved to the moto functions made under the same logical ids.
- A fault (`faults`) with an `error_type` is answered under that name, as Step Functions names
  what Lambda itself answers (`Lambda.TooManyRequestsException`: the function never ran).
- DescribeInstances' `client-token` filter, which moto does not implement, filters on the
  instance's ClientToken.
- moto parses the definition with ANTLR at CreateStateMachine and again at each execution's
  start, about 0.3 s each on this machine: the parse tree of a definition is kept, and each
  caller still gets evaluation components of its own (`parse_once`). CreateStateMachine's
  validation (that parse, then a visit that builds components it throws away, about 0.1 s)
  is done once per definition for the process (`validate_once`).
"""

import functools
import importlib
import json
import os
import threading
import time
import types
import typing
from contextlib import ExitStack
from unittest import mock

import boto3
from moto.awslambda.models import LambdaFunction
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2 import utils as ec2_utils
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.component.state.wait.wait_function import wait_function
from moto.stepfunctions.parser.asl.parse import asl_parser
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for
from moto.stepfunctions.parser.models import StepFunctionsParserBackend

from controller import clients

REGION = "us-east-1"
SCALE = 0.0002  # a 600 s wait takes 0.12 s
SERVICES = ("s3", "ec2", "cloudformation", "stepfunctions", "cloudwatch", "sns", "ssm", "scheduler")
PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": REGION,
    "AWS::AccountId": DEFAULT_ACCOUNT_ID,
    "AWS::URLSuffix": "amazonaws.com",
}


def resolve(node, arns: dict[str, str]):
    """A template value with its tokens replaced: GetAtt Arn by the moto function's ARN."""
    if isinstance(node, str):
        return node
    if "Fn::Join" in node:
        separator, parts = node["Fn::Join"]
        return separator.join(resolve(part, arns) for part in parts)
    if "Fn::GetAtt" in node:
        logical_id, attribute = node["Fn::GetAtt"]
        assert attribute == "Arn", node
        return arns[logical_id]
    if "Ref" in node:
        return PSEUDO.get(node["Ref"]) or arns[node["Ref"]]
    raise ValueError(f"unsupported token {node}")


@functools.cache
def client(service: str):
    """One client per service for the process: moto's mock serves a client whenever it was made,
    and making one costs more than most calls."""
    return boto3.client(service, region_name=REGION)


PARSE = asl_parser.AmazonStateLanguageParser.parse  # moto's own, which parse_once stands in for
TREES: dict[str, object] = {}  # a definition -> its ANTLR parse tree, for the process


def parse_once(definition: str) -> tuple[object, object]:
    """AmazonStateLanguageParser.parse, the tree made once per definition: the tree is only read
    by the Preprocessor, which makes new evaluation components each time (they are not shared
    between executions, which run in threads of their own)."""
    tree = TREES.get(definition)
    if tree is None:
        _, tree = PARSE(definition)  # a definition that does not parse raises here, every time
        TREES[definition] = tree
    return Preprocessor().visit(tree), tree


# moto's own check, which validate_once stands in for
VALIDATE = StepFunctionsParserBackend._validate_definition
VALID: set[str] = set()  # the definitions that passed it, for the process


def validate_once(definition: str) -> None:
    """CreateStateMachine's check of a definition, once per definition: the same text passes or
    fails the same way (one that fails is checked, and refused, every time)."""
    if definition not in VALID:
        VALIDATE(definition=definition)
        VALID.add(definition)


class Workflow:
    """The synthesized run controller in moto; use inside mock_aws(config=CONFIG)."""

    CONFIG: typing.ClassVar = {"stepfunctions": {"execute_state_machine": True}}

    def __init__(self, template: dict) -> None:
        self.template = template
        self.handlers: dict[str, object] = {}
        self.waits: list[tuple[str, str, int]] = []  # (execution, state, seconds)
        self.retries: list[float] = []
        self.calls: list[tuple[str, dict]] = []  # (handler, event)
        self.on_wait = None  # called (execution, state, seconds) at each Wait
        self.faults: dict[str, list[Exception]] = {}  # handler -> errors to raise first
        self.lock = threading.Lock()
        self.stack = ExitStack()

    # --- setup ---------------------------------------------------------------------------

    def __enter__(self) -> "Workflow":
        self.stack.enter_context(
            mock.patch.object(
                asl_parser.AmazonStateLanguageParser, "parse", staticmethod(parse_once)
            )
        )
        self.stack.enter_context(
            mock.patch.object(
                StepFunctionsParserBackend, "_validate_definition", staticmethod(validate_once)
            )
        )
        # moto makes a Lambda client for each Task state it runs: one for the workflow's life.
        made = functools.cache(boto_client_for)

        def lambda_client(region: str, service: str, state_credentials=None):
            return made(region, service)  # the credentials are moto's fakes

        self.stack.enter_context(
            mock.patch.object(lambda_eval_utils, "boto_client_for", lambda_client)
        )
        resources = self.template["Resources"]
        functions = {
            logical_id: resource["Properties"]
            for logical_id, resource in resources.items()
            if resource["Type"] == "AWS::Lambda::Function"
            and resource["Properties"]["Runtime"].startswith("python")
        }
        role = client("iam").create_role(RoleName="controller", AssumeRolePolicyDocument="{}")[
            "Role"
        ]
        arns, environment = {}, {}
        for logical_id, props in functions.items():
            arns[logical_id] = client("lambda").create_function(
                FunctionName=logical_id,
                Runtime="python3.12",
                Role=role["Arn"],
                Handler=props["Handler"],
                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18},
            )["FunctionArn"]
            # The asset's top-level module <module> is controller.<module>'s functions
            # (stacks/teardown/functions.py ENTRY).
            module, name = props["Handler"].split(".")
            self.handlers[logical_id] = (
                props["Handler"],
                getattr(importlib.import_module(f"controller.{module}"), name),
            )
            for key, value in (props.get("Environment") or {}).get("Variables", {}).items():
                environment[key] = resolve(value, arns)
        [machine] = [r["Properties"] for r in resources.values()
                     if r["Type"] == "AWS::StepFunctions::StateMachine"]  # fmt: skip
        definition = resolve(machine["DefinitionString"], arns)
        self.sfn = client("stepfunctions")
        self.arn = self.sfn.create_state_machine(
            name=machine["StateMachineName"], definition=definition, roleArn=role["Arn"]
        )["stateMachineArn"]
        self.definition = json.loads(definition)
        # The functions' settings, for as long as the workflow runs, as their environment.
        self.stack.enter_context(mock.patch.dict(os.environ, environment))
        for service in SERVICES:  # made here, not concurrently in the executions' threads
            clients.client(service)
        self.stack.enter_context(mock.patch.object(LambdaFunction, "invoke", self._invoke()))
        self.stack.enter_context(
            mock.patch.dict(
                ec2_utils.filter_dict_attribute_mapping, {"client-token": "client_token"}
            )
        )
        self.stack.enter_context(
            mock.patch.object(wait_function.WaitFunction, "_wait_interval", self._wait())
        )
        sleep = types.SimpleNamespace(sleep=self._retry_sleep)
        self.stack.enter_context(mock.patch.object(retrier_decl, "time", sleep))
        return self

    def __exit__(self, *_) -> None:
        """Stop what still runs, before the mock it calls goes away."""
        deadline = time.monotonic() + 10
        while running := self.running():
            try:
                for execution in running:
                    self.sfn.stop_execution(executionArn=execution["executionArn"])
            except AttributeError:  # moto: an execution whose worker has not begun yet
                assert time.monotonic() < deadline, running
                time.sleep(0.01)
        self.stack.close()

    def _invoke(self):
        workflow = self

        def invoke(function, body, request_headers, response_headers):
            event = json.loads(body) if body else {}
            name, handler = workflow.handlers[function.function_name]
            with workflow.lock:
                workflow.calls.append((name, event))
                faults = workflow.faults.get(name) or []
                fault = faults.pop(0) if faults else None
            try:
                if fault is not None:
                    raise fault
                return json.dumps(handler(event, None)).encode()
            except Exception as error:  # what Lambda's Python runtime answers
                response_headers["x-amz-function-error"] = "Unhandled"
                kind = getattr(error, "error_type", type(error).__name__)
                return json.dumps({"errorType": kind, "errorMessage": str(error)}).encode()

        return invoke

    def _wait(self):
        workflow = self

        def wait_interval(_function, env, wait_seconds):
            context = env.states.context_object.context_object_data
            where = (context["Execution"]["Name"], context["State"]["Name"], wait_seconds)
            with workflow.lock:
                workflow.waits.append(where)
            if workflow.on_wait is not None:
                workflow.on_wait(*where)
            if wait_seconds > 0:
                env.program_state_event.wait(wait_seconds * SCALE)

        return wait_interval

    def _retry_sleep(self, seconds: float) -> None:
        with self.lock:
            self.retries.append(seconds)
        time.sleep(seconds * SCALE)

    # --- driving and reading ---------------------------------------------------------------

    def running(self) -> list[dict]:
        pages = self.sfn.get_paginator("list_executions").paginate(
            stateMachineArn=self.arn, statusFilter="RUNNING"
        )
        return [e for p in pages for e in p["executions"]]

    def settle(self, timeout: float = 60) -> list[dict]:
        """Wait until no execution runs; every execution, oldest first."""
        deadline = time.monotonic() + timeout
        while self.running():
            assert time.monotonic() < deadline, f"still running: {self.running()}"
            time.sleep(0.05)  # each poll is a ListExecutions, served by moto in this process
        return self.executions()

    def executions(self) -> list[dict]:
        pages = self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.arn)
        return sorted((e for p in pages for e in p["executions"]), key=lambda e: e["startDate"])

    def states(self, execution: dict) -> list[str]:
        """The states the execution entered, in order."""
        events = self.sfn.get_execution_history(
            executionArn=execution["executionArn"], maxResults=1000
        )["events"]
        return [
            details["name"]
            for e in events
            for key, details in e.items()
            if key == "stateEnteredEventDetails"
        ]

    def output(self, execution: dict) -> dict:
        described = self.sfn.describe_execution(executionArn=execution["executionArn"])
        return json.loads(described.get("output") or "{}")

    def steps_called(self, handler: str) -> list[dict]:
        with self.lock:
            return [event for name, event in self.calls if name == handler]
