"""The training run of `python -m trainer.train` (trainer/train.py parses the command line, then
imports this module, TensorFlow and Horovod): ResNet on ImageNet TFRecords, resumable, then
evaluated. This module builds the parts and starts the loop:

    ranks.py    the agreement on failures, rank 0's log, one GPU per rank
    inputs.py   the input plan: synthetic batches or this rank's TFRecord shards
    step.py     the step: model, optimizer, allreduced sums, evaluation
    resume.py   the newest checkpoint, restored on rank 0 and broadcast
    recorder.py the log, TensorBoard, progress.json, eval.json, train.json, interrupted.json
    actions.py  the periodic checkpoint, the checkpoint on SIGTERM, the stop at --target-top1
    loop.py     the epochs, the agreed stop flags and the resolution schedule
    elastic.py, elastic_run.py   --elastic: hvd.elastic.run, one world after another

Outputs (rank 0): <model-dir>/checkpoints/ (at epoch ends every --checkpoint-every-s, at the end,
and on SIGTERM; a restart resumes from the newest, mid-epoch included), <model-dir>/tensorboard/,
<model-dir>/eval.json, <model-dir>/train.json, <model-dir>/progress.json (trainer/progress.py), and
<model-dir>/interrupted.json after a SIGTERM.
Bad input ends every rank with one `error: ...` line and exit status 2: ranks agree on failures
through a collective before going on, so none is left waiting on a rank that stopped.
SIGTERM to any rank: every rank stops at the same step within STOP_CHECK_STEPS steps, rank 0
saves a checkpoint of that step and writes interrupted.json, and every rank exits with status
EXIT_INTERRUPTED (docs/contracts.md). Under --elastic the signalled ranks' hosts leave instead
(EXIT_LEFT) while at least --min-ranks ranks are left to train.
"""

from __future__ import annotations

import os
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from trainer import affinity
from trainer.actions import (
    CheckpointOnStop,
    Checkpoints,
    Interrupted,
    StopRequest,
    StopWhenAsked,
    checkpoint_and_target,
)
from trainer.cli import fail
from trainer.config import TrainConfig
from trainer.elastic_actions import EXIT_LEFT, LeftJob
from trainer.elastic_run import ElasticRun
from trainer.inputs import InputPlan, plan_inputs
from trainer.loop import Loop, Schedule
from trainer.ranks import RunError, agree, any_rank, log, setup_devices
from trainer.recipes import Recipe
from trainer.recorder import Recorder, Timings, make_model_dir
from trainer.resume import resume
from trainer.step import Trainer, settle_recipe

# Exit status of every rank after a SIGTERM that was turned into a checkpoint (sysexits.h
# EX_TEMPFAIL: try again, and the rerun resumes); rank 0 also writes INTERRUPTED_FILE.
EXIT_INTERRUPTED = 75


def start(config: TrainConfig, started: float | None = None) -> int:
    """Train as `config` says on this rank; returns the exit status (0, EXIT_INTERRUPTED or
    EXIT_LEFT). `started`: the process's start on time.perf_counter's clock."""
    timings = Timings(time.perf_counter() if started is None else started)
    stop = StopRequest()
    # The node's CPUs, counted before this rank is bound to its GPU's socket: the input threads
    # are a share of the node, not of the socket.
    node_cpus = len(os.sched_getaffinity(0))
    bound = affinity.bind_to_gpu_socket()  # before Horovod and TensorFlow start their threads
    # Horovod: initialise before anything asks for rank, size or local rank.
    hvd.init()
    stop.install()  # after MPI_Init, which may install handlers of its own
    if bound:
        log(bound)
    try:
        if config.elastic:
            ElasticRun(config, stop, node_cpus, timings, loop_schedule).run()
        else:
            train(config, stop, node_cpus, timings)
    except RunError as exc:
        fail(str(exc))
    except Interrupted as exc:
        log(f"interrupted: {exc}; checkpoint saved, a rerun resumes from this step")
        return EXIT_INTERRUPTED
    except LeftJob as exc:
        # Never 0 while the others go on (trainer/elastic.py EXIT_LEFT); horovodrun prefixes
        # the line with this rank's old number.
        print(f"left the elastic job: {exc}", flush=True)
        return EXIT_LEFT
    return 0


def train(config: TrainConfig, stop: StopRequest, node_cpus: int, timings: Timings) -> None:
    """Every collective of the run happens in this order on every rank: the agreements while
    setting up, the restore's broadcasts, then the loop's."""
    gpu = setup_devices()
    # Horovod: the global batch is every rank's batch; the recipe follows it.
    global_batch = config.batch_size * hvd.size()
    config, recipe = settle_recipe(config, global_batch)
    plan = plan_inputs(config, global_batch)
    if config.seed is not None:
        # Rank 0's initial weights are broadcast to every rank, so its seed decides them.
        tf.keras.utils.set_random_seed(config.seed)
    trainer = Trainer(config, recipe, plan.num_classes, plan.steps_per_epoch, gpu)
    # Horovod: rank 0 alone writes the model directory, and every rank learns if it could not.
    agree(make_model_dir(config.model_dir) if hvd.rank() == 0 else None)
    manager = None
    # Horovod: checkpoints on rank 0 only, so that no two ranks write the same files.
    if hvd.rank() == 0:
        manager = tf.train.CheckpointManager(
            trainer.checkpoint, str(config.model_dir / "checkpoints"), config.keep_checkpoints
        )
    recorder = Recorder(
        config,
        rank=hvd.rank(),
        ranks=hvd.size(),
        steps_per_epoch=plan.steps_per_epoch,
        timings=timings,
        step=trainer,
        local_rank=hvd.local_rank(),
    )
    log(describe_run(config, trainer, plan))
    log(recipe.describe())
    begin = resume(trainer, manager, plan.steps_per_epoch)
    timings.start_step = trainer.global_step()
    batches = plan.batches(config, node_cpus, "/gpu:0" if gpu else None)  # its one GPU
    schedule = loop_schedule(config, recipe, plan.steps_per_epoch)
    checkpoints = Checkpoints(trainer, manager, timings)
    more, target = checkpoint_and_target(
        checkpoints, config.checkpoint_every_s, config.target_top1, recorder
    )
    actions = [CheckpointOnStop(trainer, checkpoints, recorder, stop, agree), *more]
    asked = None
    if config.stop_file is not None:
        asked = StopWhenAsked(config.stop_file, any_rank, checkpoints, log)
        actions.append(asked)
    loop = Loop(
        trainer,
        batches,
        recorder,
        schedule,
        actions=actions,
        stop_request=stop,
        agree=agree,
        on_step=recorder.steps_seen,
    )
    if config.eval_only:
        if not begin.checkpoint:
            raise RunError(f"--eval-only: no checkpoint in {config.model_dir / 'checkpoints'}")
        loop.evaluate()
        recorder.log_finished(time.perf_counter())
        return
    trained = loop.run(begin.epoch, begin.skip_steps)
    summary = target.summary() if target else {}
    if asked is not None:
        summary["stopped_as_asked_at_epoch"] = asked.stopped_at
    recorder.finish(trained, summary, end_step=trainer.global_step(), resets=[])


def loop_schedule(config: TrainConfig, recipe: Recipe, steps_per_epoch: int) -> Schedule:
    return Schedule(
        epochs=config.epochs,
        steps_per_epoch=steps_per_epoch,
        log_every=config.log_every,
        eval_every=config.eval_every,
        image_size=config.image_size,
        train_size=lambda epoch: recipe.train_size(epoch, config.image_size),
    )


def describe_run(config: TrainConfig, trainer: Trainer, plan: InputPlan) -> str:
    return (
        f"{config.arch}: {plan.num_classes} classes, {hvd.size()} ranks x {config.batch_size} = "
        f"global batch {trainer.global_batch}, {plan.steps_per_epoch} steps/epoch, peak LR "
        f"{trainer.peak_lr:g}{' (LARS)' if trainer.lars else ''}, {trainer.warmup_epochs:g} "
        f"warmup epochs, {'mixed float16' if trainer.mixed else 'float32'}, XLA "
        f"{'on' if trainer.xla else 'off'}"
    )
