"""The engine layer: decoding (the bridge engine in `generate`, the vLLM engine in
`vllm_backend`) and candidates as record rows (`sampling`). Above the data and models
layer, below the analyses."""
