


	bert-base

layers