import pytest
from settings_factory import ROOT

from operations.settings.site import SiteError, host_entries, read_site


def write(tmp_path, text):
    p = tmp_path / "sparks.yaml"
    p.write_text(text)
    return p


def test_example_site_file_gives_both_hosts():
    entries = host_entries(read_site(ROOT / "sparks.example.yaml"))
    name, data = entries["worker"]
    assert name == "spark-b.local" and data["ssh_hostname"] == "spark-b.local"
    assert data["link_rails"][0] == {"netdev": "enp1s0f0np0", "address": "192.168.100.2/24"}
    assert entries["head"][1]["link_rails"][1]["address"] == "192.168.101.1/24"
    assert data["reach_from_head"] == "spark-b.local" and "reach_from_head" not in entries["head"][1]


def test_same_ssh_name_gets_port_in_host_name(tmp_path):
    site = read_site(write(tmp_path, """
head: {ssh: 127.0.0.1, ssh_port: 2221, link: [{netdev: a, address: 10.0.0.1/24}], data: {port: 1}}
worker: {ssh: 127.0.0.1, ssh_port: 2222, link: [{netdev: a, address: 10.0.0.2/24}]}
data: {context: 524288}
"""))
    entries = host_entries(site)
    assert entries["head"][0] == "127.0.0.1:2221" and entries["worker"][0] == "127.0.0.1:2222"
    assert entries["head"][1]["context"] == 524288 and entries["head"][1]["port"] == 1
    assert "port" not in entries["worker"][1]


@pytest.mark.parametrize("text, fragment", [
    ("head: [1, 2]", "`head:` is missing"),
    ("head: {ssh: a, link: []}\nworker: {ssh: b, link: [{netdev: x, address: y}]}", "head.link must list"),
    ("head: {ssh: a, link: [{netdev: x}]}\nworker: {ssh: b, link: [{netdev: x, address: y}]}", "head.link[0] needs"),
    ("head: {ssh: a, link: [{netdev: x, address: y}], sshh: 1}\nworker: {ssh: b, link: [{netdev: x, address: y}]}",
     "unknown key(s) ['sshh']"),
    ("head: {link: [{netdev: x, address: y}]}\nworker: {ssh: b, link: [{netdev: x, address: y}]}", "head.ssh must"),
    ("head: {ssh: a\n", "not valid YAML"),
    ("nodes: {}", "unknown top-level key"),
])
def test_malformed_site_file_says_what_to_write(tmp_path, text, fragment):
    with pytest.raises(SiteError) as exc:
        read_site(write(tmp_path, text))
    assert fragment in str(exc.value) and "sparks.example.yaml" in str(exc.value)


def test_missing_site_file(tmp_path):
    with pytest.raises(SiteError, match="copy sparks.example.yaml to sparks.yaml"):
        read_site(tmp_path / "sparks.yaml")


def test_a_workers_bad_rail_is_shown_an_address_fit_for_the_worker(tmp_path):
    with pytest.raises(SiteError) as exc:
        read_site(write(tmp_path, "head: {ssh: a, link: [{netdev: x, address: 10.0.0.1/24}]}\n"
                                  "worker: {ssh: b, link: [{netdev: x, address: 10.0.0.2/32}, {netdev: y, address: "
                                  "'10.0.1.2'}]}\n"))
    assert str(exc.value).splitlines()[1:] == [
        "  - worker.link[0].address = '10.0.0.2/32': its /32 prefix holds this one address, leaving none for the other "
        "end of the cable: use /31 (a point-to-point pair, RFC 3021) or wider, e.g. 192.168.100.2/24",
        "  - worker.link[1].address = '10.0.1.2' must be IPv4 with a prefix, e.g. 192.168.101.2/24"]


def test_a_31_rail_is_accepted(tmp_path):
    site = read_site(write(tmp_path, "head: {ssh: a, link: [{netdev: x, address: 10.0.0.0/31}]}\n"
                                     "worker: {ssh: b, link: [{netdev: x, address: 10.0.0.1/31}]}\n"))
    assert host_entries(site)["worker"][1]["link_rails"] == [{"netdev": "x", "address": "10.0.0.1/31"}]
