"""Engine-side shims over the client: block keys, codecs, engines and the PD router."""
