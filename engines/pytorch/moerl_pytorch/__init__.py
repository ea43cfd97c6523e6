"""moerl's PyTorch trainer rank: GRPO and SFT steps on a Hugging Face MoE model with the loss
definitions of the native core (docs/engines.md), under moerl's rank contract."""

# The engine contract this trainer implements (docs/engines.md, "engine contract v2").
ENGINE_CONTRACT_VERSION = 2
