from runs import hooks


@hooks.register("fakeapp.discovered")
def discovered(run_view):
    return None
