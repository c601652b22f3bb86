print("containerfs")
