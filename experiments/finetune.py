"""Fine-tune a checkpoint for the checkpoint audit (GRPO or SFT): the recipes live in
`rnr_interp.analyses.finetune`; this script is their command line.

    python experiments/finetune.py --recipe grpo --out runs/ckpt/grpo
"""

from rnr_interp.analyses.finetune import main

if __name__ == "__main__":
    main()
