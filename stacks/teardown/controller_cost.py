"""What the run controller's tick costs a month, always on (it runs whether a fleet is deployed or
not), at list prices (us-east-1), for synthesis's cost lines (app.py) and docs/cost.md.

- AWS Lambda: $0.20 per million requests and $0.0000166667 per GB-second on x86, after a free
  tier of a million requests and 400,000 GB-seconds a month
  (https://aws.amazon.com/lambda/pricing/; "How AWS Pricing Works",
  https://docs.aws.amazon.com/whitepapers/latest/how-aws-pricing-works/lambda.html).
- EventBridge Scheduler: $1.00 per million invocations after 14 million free a month
  (https://aws.amazon.com/eventbridge/pricing/).

The tick's duration is not measured on AWS: TICK_SECONDS is an upper estimate (a dozen API calls
of a live run; a tick with no TrainStack makes two). Step Functions bills the long actions by
state transition, a few dozen per relaunch ($0.025 per 1,000, https://aws.amazon.com/step-functions/pricing/).
"""

LAMBDA_USD_PER_REQUEST = 0.20 / 1_000_000
LAMBDA_USD_PER_GB_SECOND = 0.0000166667
SCHEDULER_USD_PER_INVOCATION = 1.00 / 1_000_000
TICKS_PER_MONTH = 60 * 24 * 30
TICK_MEMORY_GB = 256 / 1024  # stacks/teardown/functions.py memory_size
TICK_SECONDS = 1.0


def tick_usd_per_month() -> float:
    """Lambda's requests and duration and Scheduler's invocations, before any free tier."""
    duration = TICKS_PER_MONTH * TICK_MEMORY_GB * TICK_SECONDS * LAMBDA_USD_PER_GB_SECOND
    requests = TICKS_PER_MONTH * LAMBDA_USD_PER_REQUEST
    return duration + requests + TICKS_PER_MONTH * SCHEDULER_USD_PER_INVOCATION


def controller_estimate() -> str:
    return (
        f"TeardownStack: the run controller's tick every minute ({TICKS_PER_MONTH:,} a month, "
        f"~{TICK_SECONDS:g} s at {TICK_MEMORY_GB * 1024:.0f} MB) costs ~${tick_usd_per_month():.2f} "
        "a month at list price (Lambda and EventBridge Scheduler), $0 within their monthly free "
        "tiers"
    )
