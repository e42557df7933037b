"""The link measurement's pure parts: ib_write_bw's report read (lines laid out by perftest's own format strings,
src/perftest_parameters.h: RESULT_LINE, RESULT_FMT / RESULT_FMT_G, REPORT_FMT), the inputs that make a converged run
measure again, the judgment with the most likely cause first, the script the head runs and its outputs read back."""

from __future__ import annotations

import json
import re

import pytest
from settings_factory import load_one

from operations.facts.network import BandwidthSide, RailHardware
from operations.link_measure import (
    figures_of,
    measure_script,
    rank_stop_refusal,
    record_text,
    side_readings,
    split_outputs,
    unmeasurable,
)
from operations.network.link_bandwidth import (
    changed_inputs,
    failure_of,
    figures_line,
    judge,
    measure_inputs,
    measure_reasons,
    parse_write_bw,
    verdict_text,
)

RESULT_LINE = "-" * 87
# perftest_parameters.h's REPORT_FMT, " %-7lu    %-10" PRIu64 "       %-7.2lf            %-7.2lf\t\t     %-7.6lf"
REPORT_FMT = " %-7d    %-10d       %-7.2f            %-7.2f\t\t     %-7.6f"
HEADER_G = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
HEADER_MB = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"  # perftest 4.5

CLIENT_PREAMBLE = """---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF		Device         : rocep1s0f0
 Number of qps   : 1		Transport type : IB
 Connection type : RC		Using SRQ      : OFF
 TX depth        : 128
 CQ Moderation   : 100
 Mtu             : 4096[B]
 Link type       : Ethernet
 GID index       : 3
 Max inline data : 0[B]
 rdma_cm QPs	 : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0108 PSN 0x3c1a2b RKey 0x1fffbd VAddr 0x00ffff8e7f0000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:100:01
 remote address: LID 0000 QPN 0x0108 PSN 0x9d21f0 RKey 0x1fffbd VAddr 0x00ffffa1c40000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:100:02
"""


def report(gbps: float, header: str = HEADER_G, iterations: int = 529841) -> str:
    row = REPORT_FMT % (65536, iterations, gbps + 0.03, gbps, gbps / 0.524288 / 1000)
    return f"{CLIENT_PREAMBLE}{RESULT_LINE}\n{header}\n{row}\n{RESULT_LINE}\n"


def rail(netdev: str, ibdev: str, address: str, **more) -> dict:
    return {"netdev": netdev, "ibdev": ibdev, "gid_index": 3, "address": address, "mtu": 9000, "speed_mbps": 200000,
            "operstate": "up", "port_state": "4: ACTIVE", **more}


def pair(head_rails=None, worker_rails=None, cma=(65536, 65536)) -> tuple[dict, dict]:
    head = {"rails": head_rails or [rail("enp1s0f0np0", "rocep1s0f0", "192.168.100.1/24"),
                                    rail("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101.1/24")],
            "kernel": "6.11.0-1016-nvidia", "cma_total_kb": cma[0]}
    worker = {"rails": worker_rails or [rail("enp1s0f0np0", "rocep1s0f0", "192.168.100.2/24"),
                                        rail("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101.2/24")],
              "kernel": "6.11.0-1016-nvidia", "cma_total_kb": cma[1]}
    return head, worker


def figures(a0, a1, t0, t1, errors=None) -> dict:
    return {"alone": {"enp1s0f0np0": a0, "enP2p1s0f0np0": a1},
            "together": {"enp1s0f0np0": t0, "enP2p1s0f0np0": t1}, "errors": errors or {}}


HEALTHY = figures(96.5, 96.2, 94.8, 94.6)


# --- the report ---------------------------------------------------------------------------------------------

def test_a_gbits_report_gives_its_average():
    found = parse_write_bw(report(92.58))
    assert found is not None
    assert (found["bytes"], found["iterations"], found["unit"], found["gbps"]) == (65536, 529841, "Gb", 92.58)


def test_a_report_without_the_message_rate_column_is_read():
    # older perftests print four columns under the header
    text = (f"{RESULT_LINE}\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]\n"
            f" 65536      5000               188.42             186.97\n{RESULT_LINE}\n")
    found = parse_write_bw(text)
    assert found is not None and (found["gbps"], found["msg_rate_mpps"]) == (186.97, None)


def test_perftest_45s_mb_per_second_is_read_as_mebibytes():
    found = parse_write_bw(report(11036.5, HEADER_MB))  # MB/sec: 2**20 bytes a second (format_factor 0x100000)
    assert found is not None and found["unit"] == "MB"
    assert found["gbps"] == pytest.approx(11036.5 * 2**20 * 8 / 1e9, abs=0.001)


def test_newer_perftests_mib_header_is_read():
    found = parse_write_bw(report(100.0, HEADER_MB.replace("MB/sec", "MiB/sec")))
    assert found is not None and found["unit"] == "MiB"


@pytest.mark.parametrize("output, why", [
    (" Couldn't connect to 192.168.101.2:18516\n Unable to open file descriptor for socket connection\n",
     "Couldn't connect to 192.168.101.2:18516"),
    (" Port number 1 state is Down\n Couldn't set the link layer\n", "Port number 1 state is Down"),
    ("Couldn't allocate MR with error=12\n Couldn't create IB resources\n", "Couldn't allocate MR with error=12"),
])
def test_a_failed_run_has_no_report_and_says_why(output, why):
    assert parse_write_bw(output) is None
    assert failure_of(output) == why


def test_a_header_without_its_row_is_no_report():
    assert parse_write_bw(f"{RESULT_LINE}\n{HEADER_G}\n{RESULT_LINE}\n") is None


# --- when to measure ----------------------------------------------------------------------------------------

def test_what_makes_a_converged_run_measure_again():
    head, worker = pair()
    inputs = measure_inputs(head, worker, 80.0)
    assert changed_inputs(None, inputs) == ["nothing is recorded"]
    assert changed_inputs({"inputs": inputs, "passed": True, "figures": HEALTHY}, inputs) == []
    assert changed_inputs({"inputs": inputs, "passed": False, "figures": HEALTHY}, inputs) == [
        "the last measurement did not pass"]
    mtu_head, _ = pair(head_rails=[rail("enp1s0f0np0", "rocep1s0f0", "192.168.100.1/24", mtu=8000),
                                   rail("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101.1/24", mtu=8000)])
    assert changed_inputs({"inputs": inputs, "passed": True, "figures": HEALTHY},
                          measure_inputs(mtu_head, worker, 80.0)) == ["the head's MTU"]
    # the image is no input: an upgrade or a rollback does not measure the rails the old pair serves on
    assert changed_inputs({"inputs": inputs, "passed": True, "figures": HEALTHY}, measure_inputs(head, worker, 80.0)
                          ) == []
    newer = {**worker, "kernel": "6.11.0-1017-nvidia"}
    assert changed_inputs({"inputs": inputs, "passed": True, "figures": HEALTHY},
                          measure_inputs(head, newer, 80.0)) == ["the worker's kernel"]



def test_a_new_link_min_gbps_measures_again():
    head, worker = pair()
    inputs = measure_inputs(head, worker, 80.0)
    recorded = {"inputs": inputs, "passed": True, "figures": HEALTHY}
    assert changed_inputs(recorded, measure_inputs(head, worker, 90.0)) == ["link_min_gbps"]


def test_both_sparks_must_hold_the_measurement():
    head, worker = pair()
    inputs = measure_inputs(head, worker, 80.0)
    passed = {"inputs": inputs, "passed": True, "figures": HEALTHY}
    assert measure_reasons(passed, passed, inputs) == []
    assert measure_reasons(passed, None, inputs) == ["the worker has no record of it"]
    assert measure_reasons(None, passed, inputs) == ["nothing is recorded"]


def test_the_record_holds_its_inputs_figures_and_findings():
    head, worker = pair()
    inputs = measure_inputs(head, worker, 80.0)
    found = json.loads(record_text(inputs, HEALTHY, [("twin", "slow")], False))
    assert found["inputs"] == inputs and found["figures"] == HEALTHY
    assert (found["findings"], found["passed"]) == (["slow"], False)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", found["taken"])
    assert changed_inputs(found, inputs) == ["the last measurement did not pass"]


def test_live_speed_and_states_are_not_inputs():
    head, worker = pair()
    slow = {**head, "rails": [{**r, "speed_mbps": 10000, "port_state": "1: DOWN"} for r in head["rails"]]}
    assert measure_inputs(head, worker, 80.0) == measure_inputs(slow, worker, 80.0)


# --- the judgment -------------------------------------------------------------------------------------------

def causes(findings):
    return [cause for cause, _ in findings]


def test_a_healthy_link_has_no_finding():
    head, worker = pair()
    assert judge(head, worker, HEALTHY, 80.0, None) == []


def test_a_twin_down_at_one_end_is_named_first():
    head, worker = pair(worker_rails=[rail("enp1s0f0np0", "rocep1s0f0", "192.168.100.2/24"),
                                      rail("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101.2/24",
                                           port_state="1: DOWN")])
    found = judge(head, worker, figures(96.5, None, 96.0, None, {"enP2p1s0f0np0": "Port number 1 state is Down"}),
                  80.0, None)
    assert causes(found) == ["twin"]
    assert "enP2p1s0f0np0 (roceP2p1s0f0) on the worker is down (RoCE port 1: DOWN" in found[0][1]
    assert "`rdma link`" in found[0][1]


def test_a_slow_twin_is_named_with_the_other_twins_figure():
    head, worker = pair()
    found = judge(head, worker, figures(96.5, 0.05, 96.0, 0.05), 80.0, None)
    assert causes(found) == ["twin"]
    assert "enP2p1s0f0np0 is slow: 0.05 Gb/s alone while enp1s0f0np0 carries 96.5" in found[0][1]
    assert "tc qdisc show dev enP2p1s0f0np0" in found[0][1]


def test_an_idle_twin_when_both_run_is_named():
    head, worker = pair()
    found = judge(head, worker, figures(96.5, 96.2, 150.0, 5.0), 80.0, None)  # each alone fine, one idle together
    assert causes(found) == ["twin"] and "stays idle while both run" in found[0][1]


def test_mtu_1500_at_one_end_is_named_with_both_ends():
    head, worker = pair(worker_rails=[rail("enp1s0f0np0", "rocep1s0f0", "192.168.100.2/24", mtu=1500),
                                      rail("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101.2/24", mtu=1500)])
    found = judge(head, worker, figures(24.1, 24.0, 12.0, 12.1), 80.0, None)
    assert causes(found)[0] == "mtu"
    assert "the MTU on enp1s0f0np0 is 9000 on the head and 1500 on the worker" in found[0][1]


def test_cma_zero_is_named_when_registration_fails():
    head, worker = pair(cma=(65536, 0))
    errors = {n: "Couldn't allocate MR with error=12" for n in ("enp1s0f0np0", "enP2p1s0f0np0")}
    found = judge(head, worker, figures(None, None, None, None, errors), 80.0, None)
    assert causes(found) == ["cma"]
    assert "CmaTotal is 0 kB in the worker's /proc/meminfo" in found[0][1]


def test_cma_zero_alone_is_no_finding_when_the_link_carries():
    head, worker = pair(cma=(0, 0))
    assert judge(head, worker, HEALTHY, 80.0, None) == []


def test_a_slow_link_speed_is_named():
    head, worker = pair(head_rails=[rail("enp1s0f0np0", "rocep1s0f0", "192.168.100.1/24", speed_mbps=25000),
                                    rail("enP2p1s0f0np0", "roceP2p1s0f0", "192.168.101.1/24", speed_mbps=25000)])
    found = judge(head, worker, figures(23.0, 23.0, 11.5, 11.5), 80.0, None)
    assert causes(found) == ["speed", "speed"]
    assert "enp1s0f0np0 on the head links at 25 Gb/s" in found[0][1]


def test_a_pair_that_exchanged_but_did_not_connect_points_at_the_cabling():
    head, worker = pair()
    why = "Unable to Connect the HCA's through the link"  # past the TCP exchange: the RDMA connection failed
    found = judge(head, worker, figures(96.0, None, 96.0, None, {"enP2p1s0f0np0": why}), 80.0, None)
    assert causes(found) == ["cabling"]
    assert f"nothing crossed enP2p1s0f0np0 ({why})" in found[0][1]


@pytest.mark.parametrize("why", ["Couldn't connect to 192.168.101.2:18516",
                                 "sudo: a password is required"])
def test_a_server_that_did_not_answer_points_at_the_firewall_and_sudo_not_the_cable(why):
    # the link step's pings crossed the rail before: a refused TCP exchange or a sudo that asks is the worker's side
    head, worker = pair()
    found = judge(head, worker, figures(96.0, None, 96.0, None, {"enP2p1s0f0np0": why}), 80.0, None)
    assert causes(found) == ["server"]
    assert "TCP 18516 in on enP2p1s0f0np0" in found[0][1] and "passwordless sudo" in found[0][1]


def test_sudos_refusal_is_a_failed_runs_reason():
    assert failure_of("sudo: a password is required\n") == "sudo: a password is required"


def test_a_stale_nccl_conf_is_a_finding_even_when_the_figures_pass():
    head, worker = pair()
    found = judge(head, worker, HEALTHY, 80.0, "# old\nNCCL_IB_HCA=mlx5_0\n")
    assert causes(found) == ["nccl.conf"]
    assert "/etc/nccl.conf" in found[0][1] and "NCCL_IB_HCA=mlx5_0" in found[0][1]


def test_a_short_link_without_a_known_cause_names_the_figures():
    head, worker = pair()
    found = judge(head, worker, figures(79.0, 79.5, 70.0, 70.0), 80.0, None)
    assert causes(found) == ["figures"]
    assert "80 Gb/s per rail, 160 together" in found[0][1]


def test_the_sum_is_judged_when_each_rail_alone_passes():
    head, worker = pair()
    assert causes(judge(head, worker, figures(96.0, 96.0, 70.0, 70.0), 80.0, None)) == ["figures"]


def test_the_message_names_the_figures_then_the_first_cause():
    head, worker = pair()
    fig = figures(96.5, 0.05, 96.0, 0.05)
    text = verdict_text(judge(head, worker, fig, 80.0, "NCCL_DEBUG=INFO"), fig, ["enp1s0f0np0", "enP2p1s0f0np0"])
    assert text.startswith("measured enp1s0f0np0 96.5 Gb/s alone, 96.0 Gb/s together; enP2p1s0f0np0 0.05 Gb/s "
                           "alone, 0.05 Gb/s together; both 96.0 Gb/s. Most likely cause: the twin enP2p1s0f0np0 is "
                           "slow")
    assert "; also: the engine image carries /etc/nccl.conf" in text


# --- the script and its outputs -----------------------------------------------------------------------------

def test_the_script_runs_each_rail_alone_then_both_with_servers_on_the_worker():
    head, worker = pair()
    script = measure_script(head["rails"], worker["rails"], "nvidia@192.168.100.2", 3)
    assert script.count("ib_write_bw") == 8  # 2 alone + 2 together, a server and a client each
    assert ("'sudo -n timeout 33 ib_write_bw -d roceP2p1s0f0 -i 1 -x 3 -p 18516 -D 3 -s 65536 -F --report_gbits'"
            in script)
    assert "ib_write_bw -d rocep1s0f0 -i 1 -x 3 -p 18515 -D 3 -s 65536 -F --report_gbits 192.168.100.2" in script
    assert script.index('"$d/alone0.0"') < script.index('"$d/alone1.1"') < script.index('"$d/together.1"')


def test_each_run_lasts_link_measure_s_with_its_time_limit_beyond_it():
    head, worker = pair()
    script = measure_script(head["rails"], worker["rails"], "nvidia@192.168.100.2", 1)
    assert script.count(" -D 1 ") == 8 and " -D 3 " not in script
    assert script.count("timeout 31 ib_write_bw") == 8  # the run's seconds and its connection wait


def test_outputs_are_read_back_into_figures_with_the_servers_reason():
    lines = ["==> alone0.0", *report(96.5).splitlines(), "==> alone0.0.server", "x",
             "==> alone1.1", " Couldn't connect to 192.168.101.2:18516", "==> alone1.1.server",
             " Port number 1 state is Down", "==> together.0", *report(95.0).splitlines(), "==> together.1", ""]
    found = figures_of(split_outputs(lines), ["enp1s0f0np0", "enP2p1s0f0np0"])
    assert found["alone"] == {"enp1s0f0np0": 96.5, "enP2p1s0f0np0": None}
    assert found["together"] == {"enp1s0f0np0": 95.0, "enP2p1s0f0np0": None}
    assert found["errors"] == {"enP2p1s0f0np0": "Port number 1 state is Down"}


def test_a_rail_without_a_gid_cannot_be_measured():
    record = {"rails": [{"netdev": "enp1s0f0np0", "ibdev": "rocep1s0f0", "gid_index": None,
                         "address": "192.168.100.1/24", "mtu": 9000}]}
    head = side_readings(record, {"kernel": "k", "cma_total_kb": 1}, {}, {})
    worker = side_readings(record, {"kernel": "k", "cma_total_kb": 1}, {}, {})
    assert unmeasurable(head, worker) == "enp1s0f0np0 on the head has no RDMA device or RoCE v2 GID"
    assert unmeasurable({"rails": []}, worker) == "the head has no link record (the link step writes it)"


# --- the settings -------------------------------------------------------------------------------------------

def test_link_measure_and_link_min_gbps_are_checked():
    from operations.settings.rules import validate

    s, _ = load_one("head", link_measure="loud", link_min_gbps=150.0)
    problems = validate(s)
    assert any(p.startswith("link_measure = 'loud' must be one of stop, warn, off") for p in problems), problems
    assert any(p.startswith("link_min_gbps = 150.0 is outside 0.001..120.0") for p in problems), problems


# --- the facts ----------------------------------------------------------------------------------------------

def test_a_sides_readings_and_record_are_read_in_one_answer():
    out = ["kernel 6.11.0-1016-nvidia", "perftest yes", "CmaTotal:          65536 kB", "record",
           *json.dumps({"passed": True}, indent=1).splitlines()]
    assert BandwidthSide().process(out) == {"kernel": "6.11.0-1016-nvidia", "perftest": True, "cma_total_kb": 65536,
                                            "record": {"passed": True}}
    bare = BandwidthSide().process(["kernel 6.8.0-generic", "record"])  # no perftest, no CmaTotal line, no record
    assert bare == {"kernel": "6.8.0-generic", "perftest": False, "cma_total_kb": None, "record": None}


def test_rail_hardware_reads_speed_and_states():
    found = RailHardware().process(["net enp1s0f0np0 200000 up", "net enP2p1s0f0np0 - down", "ib rocep1s0f0 4: ACTIVE",
                                    "ib roceP2p1s0f0 -"])
    assert found["net"] == {"enp1s0f0np0": {"speed_mbps": 200000, "operstate": "up"},
                            "enP2p1s0f0np0": {"speed_mbps": None, "operstate": "down"}}
    assert found["ib"] == {"rocep1s0f0": "4: ACTIVE", "roceP2p1s0f0": ""}


# --- link_check.py ------------------------------------------------------------------------------------------

def test_link_check_refuses_a_running_rank_naming_the_flag():
    refusal = rank_stop_refusal("worker", 1, "dsv41-1017-exl3-tf", running=True, stop_ok=False)
    assert refusal is not None and refusal.startswith("rank 1 runs on the worker (dsv41-1017-exl3-tf)")
    assert "--data link_check_stop=true" in refusal and "stop.py" in refusal
    assert rank_stop_refusal("worker", 1, "c", running=True, stop_ok=True) is None  # agreed: stopped first
    assert rank_stop_refusal("head", 0, "c", running=False, stop_ok=False) is None


def test_link_check_stop_is_a_setting_off_by_default():
    s, _ = load_one("head")
    assert s.link_check_stop is False
    s, _ = load_one("head", link_check_stop=True)
    assert s.link_check_stop is True


def test_a_throttled_twin_is_shown_in_significant_digits_not_as_zero():
    line = figures_line(figures(10.5, 0.0213, 12.6, 0.0198), ["enp1s0f0np0", "enP2p1s0f0np0"])
    assert "enP2p1s0f0np0 0.021 Gb/s alone, 0.02 Gb/s together" in line and "enp1s0f0np0 10.5 Gb/s alone" in line


def test_a_short_link_let_through_with_warn_is_not_measured_again_while_warn_stands():
    head, worker = pair()
    inputs = measure_inputs(head, worker, 80.0)
    warned = json.loads(record_text(inputs, HEALTHY, [("twin", "slow")], False, "warn"))
    assert measure_reasons(warned, warned, inputs, "warn") == []
    assert measure_reasons(warned, warned, inputs, "stop") == ["the last measurement did not pass"]
    checked = json.loads(record_text(inputs, HEALTHY, [("twin", "slow")], False, "check"))  # link_check.py's
    assert measure_reasons(checked, checked, inputs, "warn") == ["the last measurement did not pass"]


@pytest.mark.parametrize("record", [
    [], {"inputs": []}, {"inputs": {"head": [], "worker": {}}}, {"inputs": {"head": {"rails": ["x"]}, "worker": {}}},
    {"inputs": {"head": {}, "worker": {"rails": "enp1"}}}, {"inputs": {"head": {}, "worker": {}}, "figures": "x"},
])
def test_a_record_of_another_shape_is_measured_again_not_crashed_on(record):
    head, worker = pair()
    assert changed_inputs(record, measure_inputs(head, worker, 80.0)) == ["nothing is recorded"]
