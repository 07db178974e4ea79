"""The PD router: routing policy (pure) and its OpenAI-compatible HTTP front end."""
