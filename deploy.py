# Converge both Sparks: pyinfra inventory.py deploy.py  (--dry shows the plan, nothing changes).
# Each step below reads the Sparks' state and changes only what differs; order matters (see docs/architecture.md).
import os

from pyinfra.api.exceptions import DeployError

from operations.api_key import deploy_api_key
from operations.context import current_settings
from operations.docker_runtime import deploy_docker_runtime
from operations.facts.link import LinkRecord
from operations.gpu_clock import deploy_gpu_clock
from operations.image import deploy_image, image_ref, read_capabilities
from operations.lifecycle import deploy_health, deploy_pair
from operations.link import deploy_link
from operations.memguard import deploy_memguard
from operations.model_data import deploy_model_data
from operations.nfs import deploy_nfs
from operations.preflight import deploy_preflight
from operations.served import model_mount, rank_folder
from operations.supervise import deploy_supervise
from operations.sync import both_sparks_reached
from pyinfra import host

# 1. settings of both Sparks, validated together before any operation exists
s, problems = current_settings()
if problems:
    raise DeployError("the settings need fixing before anything is changed:\n  - " + "\n  - ".join(problems))

image = image_ref(s)


def recorded_rails():
    """This Spark's rails as the link step recorded them (read when the launch op runs)."""
    record = host.get_fact(LinkRecord, path=os.path.join(s.state_dir, "link.json")) or {}
    return record.get("rails")


# 2-5. host preparation
deploy_preflight(s)
deploy_docker_runtime(s)
deploy_gpu_clock(s)
deploy_link(s)
deploy_nfs(s)
both_sparks_reached(name="Host preparation done on both Sparks", step="host preparation")

# 6-7. what the ranks load
deploy_image(s)
deploy_model_data(s, image)
both_sparks_reached(name="Data in place on both Sparks", step="the data")

# 8. guards and keys (the supervisor comes last, once the pair serves)
deploy_memguard(s)
deploy_api_key(s)
both_sparks_reached(name="Guards in place on both Sparks", step="the guards")

# 9-10. the pair: rank 1, then rank 0; then health, smoke test and the LIVE line
deploy_pair(s, image, recorded_rails, lambda: model_mount(s),
            (lambda: read_capabilities(image)) if s.is_head else None,
            paths={"rank_cache": lambda: rank_folder(s)})
deploy_health(s)

# 11. the optional supervisor (head), started once the pair serves
deploy_supervise(s)
