"""The run's CloudWatch dashboard: throughput, loss and top-1, GPUs and network per node, the idle
alarm and the spend, from what the nodes already publish (docs/contracts.md, "Metrics")."""

from collections.abc import Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from contract.names import METRIC_NAMESPACE
from stacks.instance_types import GpuType, fleet_estimate

PERIOD = Duration.minutes(1)
WIDTH = 12  # two widgets a row (the grid is 24 wide)


class RunDashboard(Construct):
    """One dashboard per run, named after it; TrainStack outputs its URL and the watch command."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        run: str,
        gpu: GpuType,
        nodes: int,
        max_hours: float,
        instances: Sequence[ec2.CfnInstance],
        idle_alarm: cloudwatch.IAlarm,
    ) -> None:
        super().__init__(scope, construct_id)
        region = Stack.of(self).region
        name = f"horovod-fleet-{run}"

        def run_metric(metric_name: str, label: str) -> cloudwatch.Metric:
            # The leader's EMF metrics (bootstrap/records/status.py): one series per run.
            return cloudwatch.Metric(
                namespace=METRIC_NAMESPACE,
                metric_name=metric_name,
                dimensions_map={"Run": run},
                statistic="Average",
                period=PERIOD,
                label=label,
            )

        def per_node(metric_name: str, label: str) -> cloudwatch.MathExpression:
            # The CloudWatch agent's nvidia_gpu metrics carry the host besides the run: a search
            # draws one line per GPU of every node without naming them at synthesis.
            return cloudwatch.MathExpression(
                expression=(
                    f'SEARCH(\'Namespace="{METRIC_NAMESPACE}" MetricName="{metric_name}" '
                    f"Run=\"{run}\"', 'Average', {int(PERIOD.to_seconds())})"
                ),
                label=label,
                period=PERIOD,
            )

        def network(instance: ec2.CfnInstance, index: int, direction: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace="AWS/EC2",
                metric_name=f"Network{direction}",
                dimensions_map={"InstanceId": instance.ref},
                statistic="Sum",
                period=PERIOD,
                label=f"node {index} {direction.lower()}",
            )

        widgets: list[cloudwatch.IWidget] = [
            cloudwatch.TextWidget(
                markdown=(
                    f"## Run {run}\n{fleet_estimate(gpu, nodes, max_hours)}.\n\n"
                    f"From a terminal: `horovod-fleet status --run {run} --watch`, "
                    f"`horovod-fleet logs --run {run} -f`."
                ),
                width=24,
                height=3,
            ),
            cloudwatch.GraphWidget(
                title="Images per second (all GPUs)",
                left=[run_metric("images_per_s", "img/s")],
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(
                title="Loss and top-1",
                left=[run_metric("loss", "loss")],
                right=[run_metric("top1", "top-1")],
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(
                title="GPU utilization per GPU (%)",
                left=[per_node("nvidia_smi_utilization_gpu", "")],
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(
                title="GPU memory used per GPU (MiB)",
                left=[per_node("nvidia_smi_memory_used", "")],
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(
                title="Network per node (bytes a minute, ENA)",
                left=[network(instance, i, "In") for i, instance in enumerate(instances)],
                right=[network(instance, i, "Out") for i, instance in enumerate(instances)],
                width=WIDTH,
            ),
            cloudwatch.AlarmStatusWidget(
                title="Idle GPUs (the run controller deletes an idle fleet)",
                alarms=[idle_alarm],
                width=WIDTH,
            ),
            cloudwatch.SingleValueWidget(
                title="Spent by this attempt (USD, list price)",
                metrics=[run_metric("usd_so_far", "USD")],
                width=WIDTH,
            ),
            cloudwatch.SingleValueWidget(
                title="Attempt (a relaunch after a lost node counts one more)",
                metrics=[run_metric("attempt", "")],
                width=WIDTH,
            ),
        ]
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=name)
        for widget in widgets:
            self.dashboard.add_widgets(widget)
        self.url = (
            f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
            f"#dashboards/dashboard/{name}"
        )
        self.watch_command = f"horovod-fleet status --run {run} --watch"
