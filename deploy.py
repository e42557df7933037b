# Converge both Sparks: pyinfra inventory.py deploy.py  (--dry shows the plan and why a run would stop).
# Each step reads the Sparks' state and changes only what differs; the order matters (docs/architecture.md).
# See docs/commands.md for its flags and exit statuses.
import os

from pyinfra import logger

from operations.api_key import api_key
from operations.docker_runtime import docker_runtime
from operations.folders import folders
from operations.gpu_clock import gpu_clock
from operations.image import engine_image, engine_image_checked
from operations.link import link
from operations.link_measure import link_measure
from operations.memguard import memguard
from operations.model_data import model_data, model_data_checked
from operations.nfs import nfs, nfs_view_checked
from operations.preflight import preflight
from operations.ranks import pair_plans, ranks_serving
from operations.run_lock import locked, unlocked
from operations.settings import passthrough_note
from operations.settings.context import current_settings, refuse_part_of_pair
from operations.streams import streams_finished
from operations.supervise import supervision
from operations.util.barrier import both_sparks_reached
from operations.util.checks import RunStopped

# 1. the settings of both Sparks, validated together before any operation exists; both Sparks or none
refuse_part_of_pair("deploy.py")
s, problems = current_settings()
if problems:
    raise RunStopped("the settings need fixing before anything is changed:\n  - " + "\n  - ".join(problems))
if s.is_head and (note := passthrough_note(os.environ)):
    logger.info(note)  # once (the head's pass), in --dry and every run: both ranks get them, silently otherwise

# one run at a time on each Spark (released at the end; a run that died leaves a lock the next run takes over)
locked(s=s)

# 2-6. host preparation (the folders sparkfold owns right before any step writes into them)
preflight(s=s)
folders(s=s)
docker_runtime(s=s, _sudo=True)
gpu_clock(s=s, _sudo=True)
link(s=s)
nfs(s=s)
both_sparks_reached(name="Host preparation done on both Sparks", step="host preparation")

# 7-8. what the ranks load. The long work runs in the background on the Sparks (operations/streams), each piece as
# soon as what it reads is whole: the image build and its ship, the downloads, the weight files, the copies to the
# worker (verified there as they land). Awaited together, one progress line each; then the checks.
engine_image(s=s)
model_data(s=s)
streams_finished(s=s)
engine_image_checked(s=s)
model_data_checked(s=s)
nfs_view_checked(s=s)  # worker_weights = "nfs": the worker sees the checkpoint as the head has it
both_sparks_reached(name="Data in place on both Sparks", step="the data")

# 9. guards and keys (the supervisor comes last, once the pair serves)
memguard(s=s, _sudo=True)
api_key(s=s)
both_sparks_reached(name="Guards in place on both Sparks", step="the guards")

# the link's bandwidth per rail, measured when its inputs changed; a slow link stops here, before any rank loads
link_measure(s=s)

# 10. the pair: rank 1, then rank 0; then the health wait, the smoke test and the LIVE line (or the last good
# generation back); then the serving generation recorded and old ones pruned. Its handoff is made here, once: the
# other Spark, the image and the chat template's digest, and what the switch reads of the settings
ranks_serving(plans=pair_plans(s))

# 11. the optional supervisor (head), started once the pair serves
supervision(s=s, _sudo=True)

unlocked(s=s)
