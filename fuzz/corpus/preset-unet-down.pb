


	unet-down

levels