#!/bin/bash
#SBATCH --job-name=long
#SBATCH --output=long-%j.out
echo started
sleep 600
echo "should never get here"
