# omniORB stub directory
