import pytest

from kvstore.config import ClientConfig, DaemonConfig, MetaConfig, load_config, parse_size
from kvstore.errors import InvalidArgument


def test_layers_file_then_env_then_flags(tmp_path):
    f = tmp_path / "kv.toml"
    f.write_text(
        "[meta]\nport = 6000\nlease_ttl_s = 2.5\nhigh_watermark = 0.9\n"
        '[daemon]\ndram_size = "2GiB"\ntransports = ["tcp"]\n'
    )
    env = {"KVSTORE_META_PORT": "7000", "KVSTORE_META_LOW_WATERMARK": "0.5"}
    meta = load_config(MetaConfig, f, env, lease_ttl_s=9.0, host=None)
    assert (meta.port, meta.lease_ttl_s, meta.high_watermark, meta.low_watermark, meta.host) == (
        7000,
        9.0,
        0.9,
        0.5,
        "127.0.0.1",
    )
    daemon = load_config(DaemonConfig, f, {})
    assert daemon.dram_size == 2 << 30 and daemon.transports == ("tcp",)
    assert load_config(ClientConfig, None, {"KVSTORE_CLIENT_TRANSPORTS": "tcp, shm"}).transports == ("tcp", "shm")


def test_bad_settings_are_invalid_argument(tmp_path):
    f = tmp_path / "kv.toml"
    f.write_text("[meta]\nbogus = 1\n")
    with pytest.raises(InvalidArgument, match="bogus"):
        load_config(MetaConfig, f, {})
    with pytest.raises(InvalidArgument, match="watermark"):
        MetaConfig(high_watermark=0.5, low_watermark=0.6)
    with pytest.raises(InvalidArgument):
        load_config(MetaConfig, None, {"KVSTORE_META_PORT": "many"})


def test_parse_size_and_segments():
    assert parse_size("64MiB") == 64 << 20 and parse_size("1g") == 1 << 30 and parse_size("4096") == 4096
    assert DaemonConfig(dram_size=600 << 20, segment_size=256 << 20).segment_sizes == [256 << 20] * 2 + [88 << 20]
