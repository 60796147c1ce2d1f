#!/bin/bash
#SBATCH --job-name=time-limit
#SBATCH --time=1
#SBATCH --output=time-limit-%j.out
echo started
sleep 600 && echo "should never get here"
